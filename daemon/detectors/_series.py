"""A batch's steps regrouped per (run, rank) stream, in step order (pure NumPy).

Detectors judge one stream at a time. A batch may hold several messages of the same
stream, each with its own column set; :func:`streams` concatenates them once per batch
(cached on the batch) and a detector then asks for one metric's fresh values with
:meth:`StreamSteps.metric`. A metric that a message did not carry is *absent* (never a
NaN: NaN is a value that ``non_finite`` must see).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch, StepColumns
from trainvigil.schemas import RunEvent, Source

StreamKey = tuple[str, int]
"""(run_id, rank)."""

PAUSE_TAGS: tuple[str, ...] = ("checkpoint", "eval")
RL_METRICS: tuple[str, ...] = ("reward", "kl", "entropy")
"""A stream that logs any of these is an RL run: its loss and grad-norm levels follow the return."""


def is_rl(steps: StreamSteps) -> bool:
    """The stream logs an RL metric (see ``RL_METRICS``)."""
    return any(name in steps.columns for name in RL_METRICS)


"""A step carrying a non-zero value under one of these names (or an event of that kind) is a pause."""


@dataclass(frozen=True, slots=True)
class Values:
    """One metric's present values in step order."""

    step: np.ndarray
    value: np.ndarray
    time: np.ndarray

    def __len__(self) -> int:
        return len(self.step)

    def after(self, step: int) -> Values:
        """The part with step numbers above ``step`` (what a detector has not judged yet)."""
        if not len(self.step) or self.step[0] > step:
            return self
        keep = self.step > step
        return Values(self.step[keep], self.value[keep], self.time[keep])


@dataclass(slots=True)
class StreamSteps:
    """Every step of one stream in this batch, sorted by step (stable: later messages last)."""

    run_id: str
    rank: int
    world_size: int
    step: np.ndarray
    time: np.ndarray
    columns: dict[str, tuple[np.ndarray, np.ndarray]]
    """name → (float64 values, bool presence), both as long as ``step``."""
    paused: np.ndarray
    """Per step: a checkpoint/eval pause? That is, a step carrying a non-zero ``checkpoint``/``eval``
    value, or one named by an event of that kind (``agent.event("checkpoint", step=...)``)."""
    _cache: dict[str, Values] = field(default_factory=dict)
    _intervals: tuple[float, np.ndarray] | None = None

    def metric(self, name: str) -> Values:
        """The present values of ``name`` (empty when the batch has none)."""
        cached = self._cache.get(name)
        if cached is None:
            column = self.columns.get(name)
            if column is None:
                cached = Values(_EMPTY_I, _EMPTY_F, _EMPTY_F)
            else:
                values, present = column
                cached = Values(self.step[present], values[present], self.time[present])
            self._cache[name] = cached
        return cached

    def intervals(self, before: float) -> np.ndarray:
        """The time from each step to the next, the first from ``before`` (a NaN: from the first step
        itself), leaving out the intervals that end on a pause. Shared: ``stall`` and ``hang`` both ask."""
        cached = self._intervals
        if cached is None or cached[0] != before:
            time = self.time
            gaps = np.empty(len(time))
            gaps[0] = time[0] - before if math.isfinite(before) else 0.0
            np.subtract(time[1:], time[:-1], out=gaps[1:])
            cached = self._intervals = (before, gaps[~self.paused] if self.paused.any() else gaps)
        return cached[1]

    def working(self, name: str, after: int) -> Values:
        """Fresh values of ``name`` on steps that are not pauses (see ``paused``)."""
        column = self.columns.get(name)
        if column is None:
            return Values(_EMPTY_I, _EMPTY_F, _EMPTY_F)
        values, present = column
        keep = present & (self.step > after) & ~self.paused
        return Values(self.step[keep], values[keep], self.time[keep])


_EMPTY_I = np.empty(0, dtype=np.int64)
_EMPTY_F = np.empty(0, dtype=np.float64)


def _columns_of(part: StepColumns) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    return {**part.known, **part.custom}


def _merge(parts: list[StepColumns], named_pauses: list[int]) -> StreamSteps:
    if len(parts) == 1:
        return _one(parts[0], named_pauses)
    source = parts[0].source
    step = np.concatenate([p.step for p in parts]) if len(parts) > 1 else parts[0].step
    times = np.concatenate([p.times for p in parts]) if len(parts) > 1 else parts[0].times
    names: dict[str, None] = {}
    for part in parts:
        names.update(dict.fromkeys(_columns_of(part)))
    columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    everywhere = np.ones(len(step), dtype=bool)  # shared by every column present in every step
    per_part = [_columns_of(part) for part in parts]
    for name in names:
        found = [cols.get(name) for cols in per_part]
        if all(f is not None and f[1] is None for f in found):
            values = np.concatenate([f[0] for f in found]) if len(found) > 1 else found[0][0]  # type: ignore[index]
            columns[name] = (values, everywhere)
            continue
        value_parts, present_parts = [], []
        for part, f in zip(parts, found, strict=True):
            if f is None:
                value_parts.append(np.zeros(len(part)))
                present_parts.append(np.zeros(len(part), dtype=bool))
            else:
                value_parts.append(f[0])
                present_parts.append(f[1] if f[1] is not None else np.ones(len(part), dtype=bool))
        columns[name] = (np.concatenate(value_parts), np.concatenate(present_parts))
    return _in_step_order(source, step, times, columns, named_pauses)


Grouped = dict[StreamKey, tuple[list[StepColumns], list[tuple[Source, RunEvent]]]]
"""Per stream: its step parts in arrival order, and the pause events (``PAUSE_TAGS``) that name its steps."""


def grouped(batch: IngestBatch) -> Grouped:
    """The batch's step parts and pause events per stream (streams with steps only)."""
    out: Grouped = {}
    for part in batch.steps:
        if len(part):
            out.setdefault((part.source.run_id, part.source.rank), ([], []))[0].append(part)
    for source, event in batch.events:
        if event.kind in PAUSE_TAGS and event.step is not None:
            held = out.get((source.run_id, source.rank))
            if held is not None:
                held[1].append((source, event))
    return out


def _one(part: StepColumns, named_pauses: list[int]) -> StreamSteps:
    """``_merge`` of a single message (most streams of a busy batch): its arrays as they are."""
    step, times = part.step, part.times
    everywhere: np.ndarray | None = None
    columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, (values, present) in _columns_of(part).items():
        if present is None:
            if everywhere is None:
                everywhere = np.ones(len(step), dtype=bool)
            present = everywhere
        columns[name] = (values, present)
    return _in_step_order(part.source, step, times, columns, named_pauses)


def _in_step_order(
    source: Source,
    step: np.ndarray,
    times: np.ndarray,
    columns: dict[str, tuple[np.ndarray, np.ndarray]],
    named: list[int],
) -> StreamSteps:
    """The stream sorted by step (stable: later messages last), with its pause mask."""
    if len(step) > 1 and not (step[1:] >= step[:-1]).all():  # the method: np.all's wrapper costs more
        order = np.argsort(step, kind="stable")
        step, times = step[order], times[order]
        columns = {name: (v[order], p[order]) for name, (v, p) in columns.items()}
    paused = np.zeros(len(step), dtype=bool)
    for tag in PAUSE_TAGS:
        if tag in columns:
            values, present = columns[tag]
            paused |= present & (values != 0)
    if named:
        paused |= np.isin(step, np.asarray(named, dtype=np.int64))
    return StreamSteps(source.run_id, source.rank, source.world_size, step, times, columns, paused)


def streams(batch: IngestBatch) -> dict[StreamKey, StreamSteps]:
    """The batch's steps per stream (computed once per batch, then cached on it)."""
    cached = batch.cache.get("streams")
    if cached is None:
        cached = {
            key: _merge(parts, [event.step for _, event in pauses if event.step is not None])
            for key, (parts, pauses) in grouped(batch).items()
        }
        batch.cache["streams"] = cached
    return cached  # type: ignore[return-value]
