"""What one sampling period found: plain numbers, also as the wire's :class:`GilSample`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from trainvigil.schemas import GilSample, ThreadShare

from ._probe import WaitSummary
from ._threads import ThreadTally

TOP_FUNCTIONS = 5
MIN_HELD = 0.01
"""Below this much GIL-holding CPU per second in all threads together, no thread gets a share."""


@dataclass(frozen=True, slots=True)
class ThreadResult:
    """One thread over a period.

    Attributes:
        share: its part of the GIL-held time (shares of all threads add up to 1 when any held).
        kind: ``python`` (holds the GIL), ``native`` (GIL-free kernels) or ``blocked``.
        cpu: CPU seconds it used per second of the period.
        gil_cpu: the part of ``cpu`` spent holding the GIL.
        functions: its hot functions, (label, share of its GIL-holding CPU), hottest first.
        stacks: short folded stacks (``outer;inner``), same weights.
    """

    name: str
    tid: int
    share: float
    kind: str
    state: str
    cpu: float
    gil_cpu: float
    functions: list[tuple[str, float]] = field(default_factory=list)
    stacks: list[tuple[str, float]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class GilResult(WaitSummary):
    """GIL contention over one period: the probe's :class:`WaitSummary` (seconds; shares in
    [0, 1]; ``held`` estimates the share of time another thread held the GIL) and per-thread
    attribution. ``threads`` is empty where attribution is unavailable (``attributed`` False;
    ``note`` says why).
    """

    name: str
    started: float
    switch_interval: float
    gil_enabled: bool
    attributed: bool
    note: str = ""
    threads: list[ThreadResult] = field(default_factory=list)

    @property
    def period(self) -> float:
        """Seconds the period lasted."""
        return self.elapsed

    def thread(self, name: str) -> ThreadResult:
        """The thread called ``name`` (KeyError if it was not seen)."""
        for t in self.threads:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def hot_functions(self) -> list[tuple[str, str, float]]:
        """(thread, function, share of all GIL-holding CPU), hottest first."""
        total = sum(t.gil_cpu for t in self.threads)
        if total <= 0:
            return []
        out = [(t.name, label, w * t.gil_cpu / total) for t in self.threads for label, w in t.functions]
        return sorted(out, key=lambda x: -x[2])

    def to_record(self, time: float) -> GilSample:
        """This period as a wire record (the daemon stores it in ``gil_samples``)."""
        wire = {name: getattr(self, name) for name in GilSample.__struct_fields__ if name not in ("time", "threads")}
        return GilSample(
            time=time,
            **wire,
            threads=[
                ThreadShare(
                    name=t.name,
                    tid=t.tid,
                    share=t.share,
                    state=t.kind,
                    top_functions=[label for label, _ in t.functions[:3]],
                )
                for t in self.threads
            ],
        )


def _top(counter: Mapping[str, float], total: float) -> list[tuple[str, float]]:
    if total <= 0:
        return []
    ranked = sorted(counter.items(), key=lambda kv: -kv[1])[:TOP_FUNCTIONS]
    return [(label, w / total) for label, w in ranked]


def _state(tally: ThreadTally) -> str:
    return tally.states.most_common(1)[0][0] if tally.states else "?"


def build_result(
    name: str,
    started: float,
    waits: WaitSummary,
    tallies: list[ThreadTally] | None,
    switch_interval: float,
    gil_enabled: bool,
    note: str = "",
) -> GilResult:
    """Combine the probe's summary and the attribution tallies of one period."""
    wall = waits.elapsed
    threads: list[ThreadResult] = []
    if tallies is not None:
        total = sum(t.gil_cpu for t in tallies)
        if total < MIN_HELD * wall:
            total = 0.0  # nothing held the GIL: shares of noise would mislead
        for t in tallies:
            threads.append(
                ThreadResult(
                    name=t.name,
                    tid=t.tid,
                    share=t.gil_cpu / total if total > 0 else 0.0,
                    kind=t.kind(wall),
                    state=_state(t),
                    cpu=t.cpu / wall if wall > 0 else 0.0,
                    gil_cpu=t.gil_cpu / wall if wall > 0 else 0.0,
                    functions=_top(t.functions, t.gil_cpu),
                    stacks=_top(t.stacks, t.gil_cpu),
                )
            )
        threads.sort(key=lambda t: (-t.share, -t.cpu, t.name))
    summary = {f.name: getattr(waits, f.name) for f in fields(WaitSummary)}
    return GilResult(
        name=name,
        started=started,
        switch_interval=switch_interval,
        gil_enabled=gil_enabled,
        attributed=tallies is not None,
        note=note,
        threads=threads,
        **summary,
    )
