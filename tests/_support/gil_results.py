"""A GIL measurement's result as the sampler would make it, for tests of its report and its wire record."""

from __future__ import annotations

from trainvigil.agents.gil import GilResult, ThreadResult

MS = 1e-3


def gil_result(**kw: object) -> GilResult:
    """A contended second: the GIL held 97 % and a pure-Python ``loader`` thread holding most of it;
    ``kw`` replaces any field."""
    base: dict[str, object] = dict(
        name="t",
        started=0.0,
        elapsed=1.0,
        samples=100,
        wait_p50=5.2 * MS,
        wait_p90=6 * MS,
        wait_p99=7 * MS,
        wait_max=8 * MS,
        busy_share=1.0,
        wait_share=0.5,
        held=0.97,
        switch_interval=5 * MS,
        gil_enabled=True,
        attributed=True,
        threads=[
            ThreadResult(
                "loader", 7, 0.9, "python", "S", 0.9, 0.9, [("parse (data.py:10)", 0.8)], [("run;parse", 0.8)]
            ),
            ThreadResult("MainThread", 1, 0.1, "native", "R", 0.8, 0.1),
        ],
    )
    base.update(kw)
    return GilResult(**base)  # type: ignore[arg-type]
