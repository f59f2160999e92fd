"""Turn buffered ``log()`` calls into columnar :class:`StepBatch` records (pure, no I/O).

The builder takes entries in small chunks so the worker thread can give the GIL back to
the training thread between chunks: a long uninterrupted Python stretch on the worker
would stall ``log()`` for up to the interpreter's switch interval (5 ms).

``log()`` appends whatever it was given, so this is where values are checked: a metric
that is not one real number (a longer array, a string, ``None``, an object whose
``__float__`` raises) is left out of its row and counted as ``bad_value``; an entry whose
step is not an int is left out whole (``bad_step``). The first few are described by name.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from trainvigil.schemas import Column, StepBatch
from trainvigil.schemas.limits import MAX_NAME

from .._drops import DESCRIBED
from .._values import SCALAR_TYPES, array_reader, as_float, as_step, describe, utf8

Entry = tuple[Any, float, dict[str, Any]]
"""What ``log()`` appends: (step, Unix time, metrics as passed)."""

_STEP, _TIME, _METRICS = itemgetter(0), itemgetter(1), itemgetter(2)
"""An entry's parts: ``map`` with these takes a third less time than a generator over the entries."""

_F8 = np.dtype("<f8")
_I8 = np.dtype("<i8")

_Part = tuple[np.ndarray | None, np.ndarray, np.ndarray | None]
"""Part of a column: (row positions, ``None`` for "every row of the chunk"; values; presence mask or ``None``)."""


def _to_floats(raw: list[Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """``raw`` as float64, plus a presence mask when some values were not numbers."""
    types = set(map(type, raw))
    if types <= SCALAR_TYPES:
        try:
            return np.fromiter(raw, dtype=_F8, count=len(raw)), None
        except (OverflowError, TypeError, ValueError):  # an int beyond float64's range
            pass
    elif len(types) == 1 and (read := array_reader(types.pop())) is not None:  # tensors or JAX arrays only
        try:
            return np.fromiter(map(read, raw), dtype=_F8, count=len(raw)), None
        except Exception:  # one is not a real number: value by value below refuses just it
            pass
    converted = [as_float(v) for v in raw]
    bad = np.fromiter((v is None for v in converted), dtype=bool, count=len(converted))
    values = np.fromiter((0.0 if v is None else v for v in converted), dtype=_F8, count=len(converted))
    return values, (~bad if bad.any() else None)


class StepBatchBuilder:
    """Accumulates entries chunk by chunk; :meth:`finish` packs them into one batch.

    ``dropped`` counts what was left out by reason; ``notes`` describes the first few as
    (reason, description) pairs.
    """

    def __init__(self) -> None:
        self.dropped: Counter[str] = Counter()
        self.notes: list[tuple[str, str]] = []
        self._steps: list[np.ndarray] = []
        self._times: list[np.ndarray] = []
        # name -> parts, row positions already offset into the whole batch
        self._columns: dict[str, list[_Part]] = {}
        self.rows = 0

    def add(self, entries: Sequence[Entry]) -> None:
        """Pack ``entries``. All or nothing: if this raises, the builder is as it was before."""
        dropped: Counter[str] = Counter()
        notes: list[tuple[str, str]] = []
        entries, steps = self._good_steps(entries, dropped, notes)
        n = len(entries)
        parts: list[tuple[str, _Part]] = []
        if n:
            times = np.fromiter(map(_TIME, entries), dtype=_F8, count=n)
            uniform = self._uniform(list(map(_METRICS, entries)), steps, dropped, notes)
            parts = self._ragged(entries, steps, dropped, notes) if uniform is None else uniform
            parts = self._named(parts, dropped, notes)
        # Nothing above changed the builder; from here on nothing can fail.
        if n:
            offset = self.rows
            self._steps.append(steps)
            self._times.append(times)
            for name, (rows, values, mask) in parts:
                if offset:
                    rows = np.arange(offset, offset + n, dtype=np.intp) if rows is None else rows + offset
                self._columns.setdefault(name, []).append((rows, values, mask))
            self.rows += n
        self.dropped.update(dropped)
        self.notes += notes[: max(0, DESCRIBED - len(self.notes))]

    @staticmethod
    def _named(
        parts: list[tuple[str, _Part]], dropped: Counter[str], notes: list[tuple[str, str]]
    ) -> list[tuple[str, _Part]]:
        """``parts`` without columns whose name cannot go on the wire (not UTF-8, or too long):
        one such name would make the daemon refuse the whole message."""
        if all(len(name) <= MAX_NAME and utf8(name) for name, _ in parts):
            return parts
        kept = []
        for name, part in parts:
            if len(name) <= MAX_NAME and utf8(name):
                kept.append((name, part))
                continue
            lost = len(part[1]) if part[2] is None else int(part[2].sum())
            dropped["bad_value"] += lost
            if len(notes) < DESCRIBED:
                why = f"is longer than {MAX_NAME} characters" if utf8(name) else "is not UTF-8"
                notes.append(("bad_value", f"{lost} values of metric {name[:40]!r}: the name {why}"))
        return kept

    def _good_steps(
        self, entries: Sequence[Entry], dropped: Counter[str], notes: list[tuple[str, str]]
    ) -> tuple[Sequence[Entry], np.ndarray]:
        """The entries whose step is an int64, and their steps."""
        if set(map(type, map(_STEP, entries))) <= {int}:
            try:
                return entries, np.fromiter(map(_STEP, entries), dtype=_I8, count=len(entries))
            except OverflowError:
                pass
        kept: list[Entry] = []
        steps: list[int] = []
        for entry in entries:
            step = as_step(entry[0])
            if step is None:
                dropped["bad_step"] += 1
                if len(notes) < DESCRIBED:
                    what = ", ".join(map(repr, entry[2])) or "no metrics"
                    notes.append(("bad_step", f"step {describe(entry[0])} is not an int; dropped its {what}"))
            else:
                kept.append(entry)
                steps.append(step)
        return kept, np.array(steps, dtype=_I8)

    def _uniform(
        self, dicts: list[dict[str, Any]], steps: np.ndarray, dropped: Counter[str], notes: list[tuple[str, str]]
    ) -> list[tuple[str, _Part]] | None:
        """Every entry logged the same names (the common case, in any order): a column per name, each read
        with one ``itemgetter`` over the dicts; ``None`` when the names differ. A third of what comparing
        every dict's keys to the first's and slicing one flat list of values took."""
        names = tuple(dicts[0])
        if set(map(len, dicts)) != {len(names)}:
            return None
        try:
            raws = [list(map(itemgetter(name), dicts)) for name in names]
        except KeyError:  # as many names, not the same ones
            return None
        return self._columns_of(names, [None] * len(names), raws, steps, dropped, notes)

    def _ragged(
        self, entries: Sequence[Entry], steps: np.ndarray, dropped: Counter[str], notes: list[tuple[str, str]]
    ) -> list[tuple[str, _Part]]:
        by_name: dict[str, tuple[list[int], list[Any]]] = {}
        for i, (_, _, metrics) in enumerate(entries):
            for name, value in metrics.items():
                slot = by_name.get(name)
                if slot is None:
                    slot = by_name[name] = ([], [])
                slot[0].append(i)
                slot[1].append(value)
        names = tuple(by_name)
        n = len(entries)
        indexes = [None if len(by_name[k][0]) == n else np.asarray(by_name[k][0], dtype=np.intp) for k in names]
        return self._columns_of(names, indexes, [by_name[k][1] for k in names], steps, dropped, notes)

    def _columns_of(
        self,
        names: tuple[str, ...],
        indexes: list[np.ndarray | None],
        raws: list[list[Any]],
        steps: np.ndarray,
        dropped: Counter[str],
        notes: list[tuple[str, str]],
    ) -> list[tuple[str, _Part]]:
        parts: list[tuple[str, _Part]] = []
        for name, index, raw in zip(names, indexes, raws, strict=True):
            values, mask = _to_floats(raw)
            if mask is not None:
                bad = np.flatnonzero(~mask)
                dropped["bad_value"] += len(bad)
                for i in bad[: max(0, DESCRIBED - len(notes))]:
                    step = steps[i if index is None else index[i]]
                    notes.append(("bad_value", f"metric {name!r} at step {step}: {describe(raw[i])} is not a number"))
            parts.append((name, (index, values, mask)))
        return parts

    def finish(self, now: float) -> StepBatch | None:
        """The batch of every entry added so far (``None`` when there were none)."""
        n = self.rows
        if n == 0:
            return None
        columns: dict[str, Column] = {}
        for name, parts in self._columns.items():
            if len(parts) == 1 and parts[0][0] is None and parts[0][2] is None and len(parts[0][1]) == n:
                columns[name] = Column(values=parts[0][1].tobytes())
                continue
            full = np.zeros(n, dtype=_F8)
            present = np.zeros(n, dtype=np.uint8)
            for rows, values, mask in parts:
                where = rows if rows is not None else np.arange(len(values), dtype=np.intp)
                full[where] = values
                present[where] = 1 if mask is None else mask
            if present.all():
                columns[name] = Column(values=full.tobytes())
            elif present.any():
                columns[name] = Column(values=full.tobytes(), present=present.tobytes())
        steps = np.concatenate(self._steps)
        times = np.concatenate(self._times)
        return StepBatch(time=now, step=steps.tobytes(), times=times.tobytes(), columns=columns)


def build_step_batch(entries: Sequence[Entry], now: float) -> tuple[StepBatch | None, Counter[str]]:
    """Pack ``entries`` in one go; returns the batch and the drop counts by reason."""
    builder = StepBatchBuilder()
    builder.add(entries)
    return builder.finish(now), builder.dropped


def split_step_batch(batch: StepBatch, parts: int) -> Iterable[StepBatch]:
    """Cut ``batch`` into ``parts`` consecutive batches of about equal length."""
    n = len(batch.step) // 8
    bounds = np.linspace(0, n, parts + 1).astype(int)
    for lo, hi in itertools.pairwise(bounds):
        if hi <= lo:
            continue
        columns = {
            name: Column(values=col.values[lo * 8 : hi * 8], present=col.present[lo:hi] if col.present else b"")
            for name, col in batch.columns.items()
        }
        yield StepBatch(
            time=batch.time,
            step=batch.step[lo * 8 : hi * 8],
            times=batch.times[lo * 8 : hi * 8],
            columns=columns,
        )
