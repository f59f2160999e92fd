"""Build :class:`IngestBatch` objects from plain arrays: replay files, tests and benchmarks.

The detectors then see exactly what live ingest hands them, without a broker.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch, StepColumns
from trainvigil.schemas import KNOWN_METRICS, Source

Metric = np.ndarray | tuple[np.ndarray, np.ndarray | None]
"""Float values, or (values, presence mask) where an absent value is not a NaN but no value."""


def step_columns_of(
    run_id: str, rank: int, step: np.ndarray, metrics: Mapping[str, Metric], time: np.ndarray | None = None
) -> StepColumns:
    """One stream's steps as the decoder would produce them.

    ``time`` defaults to one second per step from the epoch (detectors that need wall time,
    such as slowdown windows, read it).
    """
    step = np.asarray(step, dtype=np.int64)
    times = np.asarray(time, dtype=np.float64) if time is not None else step.astype(np.float64)
    known: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    custom: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for name, metric in metrics.items():
        values, present = metric if isinstance(metric, tuple) else (metric, None)
        values = np.asarray(values, dtype=np.float64)
        if len(values) != len(step):
            raise ValueError(f"metric {name!r} has {len(values)} values for {len(step)} steps")
        mask = None if present is None else np.asarray(present, dtype=bool)
        (known if name in KNOWN_METRICS else custom)[name] = (values, mask)
    return StepColumns(Source(run_id=run_id, rank=rank), step, times, known, custom)


def batch_of(*parts: StepColumns, now: float | None = None) -> IngestBatch:
    """An IngestBatch holding ``parts`` (as if fetched together)."""
    return IngestBatch(steps=list(parts), messages=len(parts), now=now)


def piece(part: StepColumns, start: int, stop: int) -> StepColumns:
    """Steps ``start:stop`` of ``part`` (views, no copies)."""
    cut = slice(start, stop)
    return StepColumns(
        part.source,
        part.step[cut],
        part.times[cut],
        {k: (v[cut], None if m is None else m[cut]) for k, (v, m) in part.known.items()},
        {k: (v[cut], None if m is None else m[cut]) for k, (v, m) in part.custom.items()},
    )


def chunks(part: StepColumns, size: int) -> list[StepColumns]:
    """``part`` cut into pieces of ``size`` steps (how an agent's flushes arrive)."""
    return [piece(part, start, start + size) for start in range(0, len(part), size)]
