"""Turn buffered ``log()`` calls into columnar :class:`StepBatch` records (pure, no I/O).

The builder takes entries in small chunks so the worker thread can give the GIL back to
the training thread between chunks: a long uninterrupted Python stretch on the worker
would stall ``log()`` for up to the interpreter's switch interval (5 ms).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import numpy as np
from trainvigil.schemas import Column, StepBatch

Entry = tuple[Any, float, dict[str, Any]]
"""What ``log()`` appends: (step, Unix time, metrics as passed)."""

_F8 = np.dtype("<f8")
_I8 = np.dtype("<i8")


def _as_float(value: Any) -> float | None:
    try:
        # A tensor straight from autograd: read its value without torch's requires_grad warning.
        return float(value.detach() if hasattr(value, "detach") else value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None


def _is_int(step: Any) -> bool:
    return isinstance(step, int | np.integer) and not isinstance(step, bool)


def _to_floats(raw: list[Any], dropped: Counter[str]) -> tuple[np.ndarray, np.ndarray | None]:
    """``raw`` as float64, plus a presence mask when some values were not numbers."""
    if None not in raw:  # NumPy would turn None into a NaN that looks logged
        try:
            values = np.asarray(raw, dtype=_F8)
            if values.shape == (len(raw),):
                return values, None
        except (TypeError, ValueError, RuntimeError, OverflowError):
            pass
    converted = [_as_float(v) for v in raw]
    bad = np.fromiter((v is None for v in converted), dtype=bool, count=len(converted))
    dropped["bad_value"] += int(bad.sum())
    values = np.fromiter((math.nan if v is None else v for v in converted), dtype=_F8, count=len(converted))
    return values, ~bad


class StepBatchBuilder:
    """Accumulates entries chunk by chunk; :meth:`finish` packs them into one batch."""

    def __init__(self) -> None:
        self.dropped: Counter[str] = Counter()
        self._steps: list[np.ndarray] = []
        self._times: list[np.ndarray] = []
        # name -> list of (row offset, row positions or None for "every row", values, mask)
        self._columns: dict[str, list[tuple[np.ndarray | None, np.ndarray, np.ndarray | None]]] = {}
        self.rows = 0

    def add(self, entries: Sequence[Entry]) -> None:
        if not all(type(e[0]) is int for e in entries) and not all(_is_int(e[0]) for e in entries):
            kept = [e for e in entries if _is_int(e[0])]
            self.dropped["bad_step"] += len(entries) - len(kept)
            entries = kept
        n = len(entries)
        if n == 0:
            return
        self._steps.append(np.fromiter((e[0] for e in entries), dtype=_I8, count=n))
        self._times.append(np.fromiter((e[1] for e in entries), dtype=_F8, count=n))
        offset = self.rows
        dicts = [e[2] for e in entries]
        names = tuple(dicts[0])
        if all(map(names.__eq__, map(tuple, dicts))):
            self._add_uniform(names, dicts, offset)
        else:
            self._add_ragged(entries, offset)
        self.rows += n

    def _add_uniform(self, names: tuple[str, ...], dicts: list[dict[str, Any]], offset: int) -> None:
        """Every entry logged the same names in the same order (the common case): one flat array."""
        n, k = len(dicts), len(names)
        if any(hasattr(v, "detach") for v in dicts[0].values()):  # tensors: the careful path detaches them
            self._add_columns(names, [list(range(n))] * k, [[d[name] for d in dicts] for name in names], n, offset)
            return
        try:
            # float() of each value; None, strings and the like raise and take the careful path.
            matrix = np.fromiter(chain.from_iterable(map(dict.values, dicts)), dtype=_F8, count=n * k).reshape(n, k)
            # NumPy reads None as NaN; a NaN is rare, so only then look for a None behind it.
            if np.isnan(matrix).any() and any(v is None for d in dicts for v in d.values()):
                raise TypeError("None among the values")
        except (TypeError, ValueError, RuntimeError, OverflowError):
            columns = [[d[name] for d in dicts] for name in names]
            self._add_columns(names, [list(range(n))] * k, columns, n, offset)
            return
        spread = None if offset == 0 else np.arange(offset, offset + n, dtype=np.intp)
        for j, name in enumerate(names):
            self._columns.setdefault(name, []).append((spread, np.ascontiguousarray(matrix[:, j]), None))

    def _add_ragged(self, entries: Sequence[Entry], offset: int) -> None:
        by_name: dict[str, tuple[list[int], list[Any]]] = {}
        for i, (_, _, metrics) in enumerate(entries):
            for name, value in metrics.items():
                slot = by_name.get(name)
                if slot is None:
                    slot = by_name[name] = ([], [])
                slot[0].append(i)
                slot[1].append(value)
        names = tuple(by_name)
        self._add_columns(names, [by_name[k][0] for k in names], [by_name[k][1] for k in names], len(entries), offset)

    def _add_columns(
        self, names: tuple[str, ...], indexes: list[list[int]], raws: list[list[Any]], n: int, offset: int
    ) -> None:
        for name, index, raw in zip(names, indexes, raws, strict=True):
            values, mask = _to_floats(raw, self.dropped)
            rows = None if len(index) == n else np.asarray(index, dtype=np.intp) + offset
            if rows is None and offset:
                rows = np.arange(offset, offset + n, dtype=np.intp)
            self._columns.setdefault(name, []).append((rows, values, mask))

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
