"""Records → Arrow tables, column by column (pure: no DuckDB).

Every table the writer appends to is built here as named columns, and the writer inserts them
``BY NAME``: the column lists come from the wire structs' own fields (:class:`Rows`), so nothing has
to keep a tuple in ``schema.sql``'s column order by hand. ``tests/unit/test_store_columns.py`` checks that
every field of every wire record has its column (or is listed as not stored, with the reason).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from trainvigil.daemon.batch.decode import StepColumns
from trainvigil.schemas import (
    KNOWN_METRICS,
    Anomaly,
    CanaryResult,
    CheckpointDigest,
    GilSample,
    Heartbeat,
    RunEnd,
    RunEvent,
    RunStart,
    Source,
)

Columns = dict[str, list[Any]]
"""A table's rows as named columns of Python values (``time`` columns as aware datetimes, JSON as text)."""

STEP_COLUMNS = ["run_id", "rank", "step", "time", *KNOWN_METRICS, "extra"]
"""The columns of ``steps`` (the known metrics of the wire, then the map of custom ones)."""
_EXTRA_TYPE = pa.map_(pa.string(), pa.float64())


def ts(seconds: float | None) -> datetime | None:
    """Unix seconds as an aware UTC datetime (DuckDB TIMESTAMPTZ: the instant, whatever the session's zone)."""
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)


def as_json(value: Any) -> str:
    return msgspec.json.encode(value, enc_hook=repr).decode()


@dataclass(frozen=True)
class Rows:
    """How a wire record maps onto its table: the source fields kept, then the record's own fields,
    less ``unstored``; ``json`` fields are stored as JSON text, ``time`` as an instant; ``derived``
    columns the writer computes (not fields of the record)."""

    table: str
    record: type[msgspec.Struct]
    source: tuple[str, ...] = ("run_id", "rank")
    unstored: frozenset[str] = frozenset()
    json: frozenset[str] = frozenset()
    derived: tuple[str, ...] = ()

    @property
    def fields(self) -> tuple[str, ...]:
        """The record's fields that have a column of the same name."""
        return tuple(f for f in self.record.__struct_fields__ if f not in self.unstored)

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.source, *self.fields, *self.derived)

    def __call__(self, items: Sequence[Any]) -> Columns:
        """``items`` (``(source, record)`` pairs, or bare records without ``source``) as columns."""
        records = [item[1] for item in items] if self.source else list(items)
        out: Columns = {name: [getattr(item[0], name) for item in items] for name in self.source}
        for name in self.fields:
            values = [getattr(r, name) for r in records]
            if name in self.json:
                values = [as_json(v) for v in values]
            elif name == "time":
                values = [ts(v) for v in values]
            out[name] = values
        return out


EVENTS = Rows("events", RunEvent, json=frozenset({"fields"}))
HEARTBEATS = Rows(
    "heartbeats",
    Heartbeat,
    source=("run_id", "rank", "host", "pid"),
    unstored=frozenset({"stack"}),  # a stack sample for the stall detector's message, not history
    json=frozenset({"dropped"}),
)
GIL_SAMPLES = Rows("gil_samples", GilSample, json=frozenset({"threads"}))
CHECKPOINTS = Rows("checkpoints", CheckpointDigest, json=frozenset({"tensors"}))
ANOMALIES = Rows("anomalies", Anomaly, source=(), derived=("updated_at",))
"""``time`` is when the episode opened and ``updated_at`` the update's own time (:func:`anomaly_columns`)."""
CANARIES = Rows("canary_results", CanaryResult, source=())
RECORDS = (EVENTS, HEARTBEATS, GIL_SAMPLES, CHECKPOINTS, ANOMALIES, CANARIES)
"""Every wire record stored as a row of its own table."""

RUN_START_FIELDS = ("argv", "config")
"""A ``run_start`` is an ``events`` row of that kind; these of its fields are its ``fields`` (its
``agent_version`` is not stored: the agent's version reaches the log, not the history)."""
RUN_END_FIELDS = ("status", "dropped", "error")
"""A ``run_end``'s ``fields``; its ``last_step`` is the row's ``step`` (``error`` only when set)."""
FOLDED: dict[type[msgspec.Struct], tuple[str, ...]] = {
    RunStart: (*RUN_START_FIELDS, "time", "agent_version"),
    RunEnd: (*RUN_END_FIELDS, "time", "last_step"),
}
"""Records stored as ``events`` rows, and the fields that accounts for."""


def concat(*parts: Columns) -> Columns:
    """Columns of the same table one after the other."""
    return {name: [v for part in parts for v in part[name]] for name in parts[0]}


def event_columns(
    events: Sequence[tuple[Source, RunEvent]],
    starts: Sequence[tuple[Source, RunStart]],
    ends: Sequence[tuple[Source, RunEnd]],
) -> Columns:
    """The ``events`` rows of a batch: its events, then each rank's ``run_start`` and ``run_end``."""
    pairs = [*starts, *ends]
    return concat(
        EVENTS(events),
        {
            "run_id": [s.run_id for s, _ in pairs],
            "rank": [s.rank for s, _ in pairs],
            "kind": ["run_start"] * len(starts) + ["run_end"] * len(ends),
            "step": [None] * len(starts) + [e.last_step for _, e in ends],
            "fields": [as_json({"argv": r.argv, "config": r.config}) for _, r in starts]
            + [
                as_json({"status": e.status, "dropped": e.dropped, **({"error": e.error} if e.error else {})})
                for _, e in ends
            ],
            "time": [ts(r.time) for _, r in pairs],
        },
    )


def anomaly_columns(anomalies: Sequence[Anomaly], opened: Sequence[datetime | None]) -> Columns:
    """Alert rows: ``time`` is ``opened`` (when each one's episode opened), ``updated_at`` the update's time."""
    out = ANOMALIES(anomalies)
    out["updated_at"] = out["time"]
    out["time"] = list(opened)
    out["episode"] = [e or None for e in out["episode"]]
    return out


def canary_columns(results: Sequence[CanaryResult]) -> Columns:
    out = CANARIES(results)
    # Results of an older runner only said whether they passed.
    out["verdict"] = [c.verdict or ("pass" if c.passed else "fail") for c in results]
    return out


def table(columns: Columns, schema: pa.Schema) -> pa.Table:
    """``columns`` as an Arrow table of the types ``schema`` (the table's) gives them by name. A value
    that does not fit its column raises here, as it would in DuckDB."""
    names = list(columns)
    arrays = [pa.array(columns[n], type=schema.field(n).type) for n in names]
    return pa.Table.from_arrays(arrays, names=names)


def _known_column(parts: list[StepColumns], metric: str, n: int) -> pa.Array:
    """One known metric over every part: NULL where a part lacks it or a row's mask says absent."""
    if not any(metric in part.known for part in parts):
        return pa.nulls(n, pa.float64())
    values = np.empty(n, np.float64)
    present = np.ones(n, np.bool_)
    at = 0
    for part in parts:
        end = at + len(part)
        if metric in part.known:
            vals, mask = part.known[metric]
            values[at:end] = vals
            if mask is not None:
                present[at:end] = mask
        else:
            values[at:end] = 0.0
            present[at:end] = False
        at = end
    return pa.array(values, type=pa.float64(), mask=None if present.all() else ~present)


def _extra_column(parts: list[StepColumns], n: int) -> pa.Array:
    """Custom metrics of every part as one MAP column, built with NumPy (no loop per row)."""
    rows, keys, values = [], [], []
    at = 0
    for part in parts:
        for name, (vals, mask) in part.custom.items():
            where = np.arange(len(part)) if mask is None else np.flatnonzero(mask)
            rows.append(where + at)
            keys.append(np.full(len(where), name, dtype=object))
            values.append(vals[where])
        at += len(part)
    if not rows:
        return pa.nulls(n, _EXTRA_TYPE)
    row = np.concatenate(rows)
    order = np.argsort(row, kind="stable")
    counts = np.bincount(row, minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(
        pa.array(offsets),
        pa.array(np.concatenate(keys)[order], type=pa.string()),
        pa.array(np.concatenate(values)[order], type=pa.float64()),
        mask=pa.array(counts == 0),
    )


def steps_table(parts: list[StepColumns]) -> pa.Table:
    """The ``steps`` rows of a batch as one Arrow table, one array per column.

    Built with NumPy over the whole batch (a handful of pyarrow calls per batch, not per
    message): a fleet of thousands of ranks sends many small messages.
    """
    lengths = np.fromiter((len(part) for part in parts), np.int64, len(parts))
    n = int(lengths.sum())
    names: dict[str, int] = {}
    run_index = np.fromiter((names.setdefault(p.source.run_id, len(names)) for p in parts), np.int32, len(parts))
    run_id = pa.DictionaryArray.from_arrays(np.repeat(run_index, lengths), pa.array(list(names), pa.string()))
    ranks = np.fromiter((p.source.rank for p in parts), np.int32, len(parts))
    times = np.concatenate([p.times for p in parts]) if parts else np.empty(0)
    columns: dict[str, pa.Array] = {
        "run_id": run_id.dictionary_decode(),
        "rank": pa.array(np.repeat(ranks, lengths)),
        "step": pa.array(np.concatenate([p.step for p in parts]) if parts else np.empty(0, np.int64)),
        "time": pa.array((times * 1e6).astype("int64"), type=pa.timestamp("us", tz="UTC")),
        "extra": _extra_column(parts, n),
    }
    for metric in KNOWN_METRICS:
        columns[metric] = _known_column(parts, metric, n)
    return pa.Table.from_arrays([columns[name] for name in STEP_COLUMNS], names=STEP_COLUMNS)
