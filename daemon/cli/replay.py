"""``vigil replay``: recorded metrics through the live detectors, offline (no broker, no daemon).

A recording has columns ``run_id``, ``rank``, ``step``, any metric names and optionally
``time`` (Unix seconds; without it, one second per step), rows in any order. An empty cell
(null) is an absent value; ``nan``/``inf`` are values (``non_finite`` judges them). Rows are
sorted per (run_id, rank, step) and fed to :func:`detectors.build` as live ingest feeds
them: a run at a time, in time order, batches of up to ``batch_steps`` steps per rank with
every rank side by side (cross-rank detectors compare them), ``batch.now`` the batch's latest
time. A pause of the whole run longer than ``GAP_S`` is replayed as silence: no batch spans
it and empty batches tick through it (as the daemon's fetch loop does), so ``stall`` sees it.
A rank that goes quiet while others keep logging is judged at batch boundaries, so up to
``batch_steps`` steps later than live.
After its last row a run ends cleanly (a ``run_end`` per rank), as when its agents closed.

Recorded run records (``run_start``, ``event``, ``heartbeat``, ``run_end``: what the
``events`` and ``heartbeats`` tables hold) can ride along (``records=``): each goes into the
first batch whose ``now`` reaches its time, ticks through silences included, so ``stall``
sees the heartbeats of a live but quiet rank and a rank's recorded ``run_end`` ends it when
it ended, not when the run's last rank did; only ranks with no recorded ``run_end`` get one
after the run's last row.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, TextIO, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from trainvigil.daemon import detectors
from trainvigil.daemon.alerts.format import REPLAY_FIELDS, as_result
from trainvigil.daemon.batch.decode import IngestBatch, StepColumns
from trainvigil.daemon.batch.from_arrays import batch_of, piece, step_columns_of
from trainvigil.daemon.cli.recording_format import FORMATS, format_of
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.formatting import render
from trainvigil.errors import ReplayError
from trainvigil.schemas import Anomaly, Heartbeat, RunEnd, RunEvent, RunStart, Source
from trainvigil.schemas.inputs import InputRefusedError, open_input

REQUIRED: tuple[str, ...] = ("run_id", "rank", "step")
_ONE_THREAD: dict[str, bool] = {"use_threads": False, "pre_buffer": False}
"""Parquet read on the calling thread (a recording is small)."""
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf}
_NON_FINITE["-infinity"] = -math.inf
GAP_S = 30.0
"""Steps further apart than this (across all ranks of a run) were silence on the wire: no
batch spans the gap, and empty batches tick through it."""
TICK_S = 10.0
"""Through a silence, an empty batch every this many seconds (at most MAX_TICKS per silence)."""
MAX_TICKS = 1000
JSON_DEPTH = 32
"""The deepest nesting a jsonl line may have: a row is one flat object, so a line nested deeper is refused
before it is decoded (a decoder recursing 100 000 levels down fails with ``RecursionError``, or worse)."""
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
RunRecord: TypeAlias = RunStart | RunEnd | RunEvent | Heartbeat
"""The run records a replay can carry beside the steps (``records=`` of :func:`batches`)."""


def read_recording(path: str | Path, fmt: str | None = None) -> pa.Table:
    """Read a recording as an Arrow table (columns as stored; :func:`replay_table` checks them).

    Raises:
        ReplayError: the file is missing, not readable as ``fmt``, or has no rows.
    """
    fmt = format_of(path, fmt)
    if fmt not in FORMATS:
        raise ReplayError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    try:
        f = open_input(path, max_bytes=None, follow_symlinks=True)  # a FIFO or a device: refused, never read
    except FileNotFoundError:
        raise ReplayError(f"{path} does not exist; pass a recording (csv, parquet or jsonl)") from None
    except InputRefusedError as exc:
        raise ReplayError(f"{exc}; pass a recording (csv, parquet or jsonl)") from None
    except OSError as exc:
        raise ReplayError(f"{path} cannot be opened: {exc}") from None
    try:
        with f:
            if fmt == "csv":
                # Only an empty cell is null: "nan", "NaN", "inf" stay values.
                options = pa_csv.ConvertOptions(
                    null_values=[""], strings_can_be_null=True, column_types={"run_id": pa.string()}
                )
                table = pa_csv.read_csv(pa.BufferReader(_in_arrow_memory(f)), convert_options=options)
            elif fmt == "parquet":
                table = pq.read_table(pa.BufferReader(_in_arrow_memory(f)), **_ONE_THREAD)
            else:
                table = _read_jsonl(Path(path), f)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, UnicodeDecodeError) as exc:
        # UnicodeDecodeError: a binary file where text was expected.
        raise ReplayError(f"{path} is not a readable {fmt} file: {exc}") from None
    if not table.num_rows:
        raise ReplayError(f"{path} has no rows (a header only?); record some steps first")
    return table


def _in_arrow_memory(f: BinaryIO) -> pa.Buffer:
    """All of ``f`` (the descriptor :func:`open_input` checked) in a buffer Arrow allocated and owns.

    Arrow's readers are never handed a Python file or ``bytes``: Arrow wraps either in an object whose
    release takes the GIL, and released on one of Arrow's threads while the interpreter finalises, it is
    exited by Python and aborts the process ("terminate called without an active exception", exit -6) after
    the answer was printed, once in a few runs on a busy machine.
    """
    fd = f.fileno()
    buffer = pa.allocate_buffer(os.fstat(fd).st_size)
    with memoryview(buffer) as view:
        filled = 0
        while filled < len(view) and (n := os.preadv(fd, [view[filled:]], filled)):
            filled += n
    return buffer.slice(0, filled)


def _json_cell(value: object) -> object:
    """JSON has no NaN: accept Python's ``NaN``/``Infinity`` literals and the strings "nan", "inf"."""
    if isinstance(value, str) and value.lower() in _NON_FINITE:
        return _NON_FINITE[value.lower()]
    return value


def _too_deep(line: str) -> bool:
    """Whether the JSON text ``line`` nests lists and objects deeper than :data:`JSON_DEPTH`, told without
    decoding it (brackets inside strings do not count)."""
    if line.count("[") + line.count("{") <= JSON_DEPTH:  # every ordinary row: one object
        return False
    depth = 0
    for bracket in re.findall(r"[\[\]{}]", _STRING.sub("", line)):
        depth += 1 if bracket in "[{" else -1
        if depth > JSON_DEPTH:
            return True
    return False


def _read_jsonl(path: Path, binary: BinaryIO) -> pa.Table:
    rows: list[dict[str, object]] = []
    with io.TextIOWrapper(binary, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if _too_deep(line):
                raise ReplayError(
                    f"{path} line {n} is nested deeper than {JSON_DEPTH} levels; a line is one flat object"
                )
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ReplayError(f"{path} line {n} is not JSON: {exc}") from None
            if not isinstance(row, dict):
                raise ReplayError(f"{path} line {n} is not a JSON object")
            rows.append(row)
    names = list(dict.fromkeys(name for row in rows for name in row))
    columns = {}
    for name in names:
        cells = [row.get(name) for row in rows] if name == "run_id" else [_json_cell(row.get(name)) for row in rows]
        try:
            columns[name] = pa.array(cells)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ReplayError(f"{path}: column {name!r} mixes kinds of values ({exc}); use numbers or null") from None
    return pa.table(columns)


def _column(table: pa.Table, name: str, kind: pa.DataType, *, nullable: bool) -> pa.ChunkedArray:
    column = table[name]
    if not nullable and column.null_count:
        raise ReplayError(f"column {name!r} has {column.null_count} empty cells; every row needs run_id, rank, step")
    try:
        return pc.cast(column, kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        what = "text" if kind == pa.string() else "whole numbers" if kind == pa.int64() else "numbers"
        raise ReplayError(f"column {name!r} ({column.type}) must hold {what}: {exc}; fix or drop the column") from None


def _flattened(table: pa.Table) -> pa.Table:
    """A MAP column of custom metrics (``steps.extra``, as ``vigil export`` writes it) as one column per key."""
    for name in [n for n in table.column_names if pa.types.is_map(table[n].type)]:
        maps = table[name].combine_chunks()
        table = table.drop_columns([name])
        for key in pc.unique(maps.keys).to_pylist():
            if key is not None and key not in table.column_names:
                value = pc.map_lookup(maps, pa.scalar(key, maps.type.key_type), "last")
                table = table.append_column(key, value)
    return table


def _normalised(table: pa.Table) -> pa.Table:
    """The recording with checked types (run_id text, rank/step int64, the rest float64), sorted."""
    missing = [name for name in REQUIRED if name not in table.column_names]
    if missing:
        raise ReplayError(
            f"missing column(s) {', '.join(missing)}; a recording needs run_id, rank, step and metric columns "
            f"(found: {', '.join(table.column_names) or 'none'})"
        )
    table = _flattened(table)
    metrics = [name for name in table.column_names if name not in (*REQUIRED, "time")]
    if not metrics:
        raise ReplayError("no metric columns besides run_id, rank, step and time: nothing to replay")
    columns = {
        "run_id": _column(table, "run_id", pa.string(), nullable=False),
        "rank": _column(table, "rank", pa.int64(), nullable=False),
        "step": _column(table, "step", pa.int64(), nullable=False),
    }
    if "time" in table.column_names:
        time = table["time"]
        if pa.types.is_timestamp(time.type):  # ``vigil export`` writes TIMESTAMPTZ: Unix seconds here
            micros = pc.cast(pc.cast(time, pa.timestamp("us", tz=time.type.tz)), pa.int64())
            table = table.set_column(table.column_names.index("time"), "time", pc.divide(micros, 1e6))
        columns["time"] = _column(table, "time", pa.float64(), nullable=False)
    columns.update({name: _column(table, name, pa.float64(), nullable=True) for name in metrics})
    # Arrow's sort is stable: rows of one step keep their file order (a later row wins, as live).
    return pa.table(columns).sort_by([("run_id", "ascending"), ("rank", "ascending"), ("step", "ascending")])


def _runs(table: pa.Table) -> Iterator[list[StepColumns]]:
    """Per run (in run_id order), one :class:`StepColumns` per rank."""
    run_ids = table["run_id"].to_numpy(zero_copy_only=False)
    ranks = table["rank"].to_numpy()
    steps = table["step"].to_numpy()
    times = table["time"].to_numpy() if "time" in table.column_names else None
    metrics = {}
    for name in table.column_names:
        if name in (*REQUIRED, "time"):
            continue
        column = table[name]
        values = pc.fill_null(column, 0.0).to_numpy()
        metrics[name] = (values, None if not column.null_count else column.is_valid().to_numpy(zero_copy_only=False))
    n = len(steps)
    starts = [0, *(np.flatnonzero((run_ids[1:] != run_ids[:-1]) | (ranks[1:] != ranks[:-1])) + 1).tolist(), n]
    run: list[StepColumns] = []
    for lo, hi in itertools.pairwise(starts):
        if run and run[0].source.run_id != run_ids[lo]:
            yield run
            run = []
        cut = slice(lo, hi)
        run.append(
            step_columns_of(
                str(run_ids[lo]),
                int(ranks[lo]),
                steps[cut],
                {name: (v[cut], None if p is None else p[cut]) for name, (v, p) in metrics.items()},
                None if times is None else times[cut],
            )
        )
    if run:
        yield run


def _windows(ranks: list[StepColumns], batch_steps: int) -> Iterator[list[StepColumns]]:
    """A run's steps in time order, cut at ``batch_steps`` steps per rank and before every silence.

    Each window holds a contiguous part of every rank that logged in it, so each rank's steps
    still arrive in step order (its sort key is its running maximum time).
    """
    key = np.concatenate([np.maximum.accumulate(p.times) for p in ranks])
    owner = np.concatenate([np.full(len(p), i) for i, p in enumerate(ranks)])
    order = np.argsort(key, kind="stable")
    key, owner = key[order], owner[order]
    limit = batch_steps * len(ranks)
    silences = (np.flatnonzero(np.diff(key) > GAP_S) + 1).tolist()
    taken = [0] * len(ranks)
    for lo, hi in itertools.pairwise([0, *silences, len(key)]):
        for start in range(lo, hi, limit):
            parts = []
            for i, n in enumerate(np.bincount(owner[start : min(start + limit, hi)], minlength=len(ranks)).tolist()):
                if n:
                    parts.append(piece(ranks[i], taken[i], taken[i] + n))
                    taken[i] += n
            yield parts


def _ticks(after: float, before: float) -> Iterator[IngestBatch]:
    """Empty batches through a silence, as the daemon's fetch loop runs when nothing arrives."""
    every = max(TICK_S, (before - after) / MAX_TICKS)
    for now in np.arange(after + every, before, every).tolist():
        yield IngestBatch(now=now)


class _Pending:
    """One run's recorded records, oldest first, handed out as replay time reaches them."""

    def __init__(self, records: list[tuple[Source, RunRecord]]) -> None:
        self._records = sorted(records, key=lambda r: r[1].time)
        self._next = 0
        self.ended: set[int] = set()
        """Ranks whose recorded ``run_end`` was handed out."""

    def attach(self, batch: IngestBatch, now: float) -> IngestBatch:
        """Put every record up to ``now`` into ``batch``; returns it."""
        while self._next < len(self._records) and self._records[self._next][1].time <= now:
            source, record = self._records[self._next]
            self._next += 1
            if isinstance(record, RunEnd):
                batch.run_ends.append((source, record))
                self.ended.add(source.rank)
            elif isinstance(record, RunStart):
                batch.run_starts.append((source, record))
            elif isinstance(record, Heartbeat):
                batch.heartbeats.append((source, record))
            else:
                batch.events.append((source, record))
        return batch

    def latest(self) -> float:
        """The time of the last record (-inf when there is none)."""
        return self._records[-1][1].time if self._records else -math.inf


def batches(
    table: pa.Table, *, batch_steps: int = 256, records: Sequence[tuple[Source, RunRecord]] = ()
) -> Iterator[IngestBatch]:
    """The recording as the batches live ingest would hand the detectors (see the module docstring).

    Args:
        records: recorded run records of the same runs (any order), replayed at their times.

    Raises:
        ReplayError: required columns missing or empty, or a column that is not numeric.
    """
    by_run: dict[str, list[tuple[Source, RunRecord]]] = {}
    for source, record in records:
        by_run.setdefault(source.run_id, []).append((source, record))
    for ranks in _runs(_normalised(table)):
        pending = _Pending(by_run.get(ranks[0].source.run_id, []))
        now = -math.inf
        for parts in _windows(ranks, batch_steps):
            if now > -math.inf:
                for tick in _ticks(now, min(float(p.times[0]) for p in parts)):
                    yield pending.attach(tick, tick.now if tick.now is not None else now)
            now = max(now, *(float(p.times.max()) for p in parts))
            yield pending.attach(batch_of(*parts, now=now), now)
        now = max(now, pending.latest())
        last = pending.attach(IngestBatch(now=now), now)
        last.run_ends.extend(
            (Source(run_id=p.source.run_id, rank=p.source.rank), RunEnd(time=now, last_step=int(p.step[-1])))
            for p in ranks
            if p.source.rank not in pending.ended
        )
        yield last


def replay_table(
    table: pa.Table,
    config: DaemonConfig | None = None,
    *,
    batch_steps: int = 256,
    records: Sequence[tuple[Source, RunRecord]] = (),
) -> list[Anomaly]:
    """Every alert update the configured detectors raise on a recording, in the order raised.

    Args:
        table: columns run_id, rank, step, optional time (Unix seconds), metrics; null = absent.
        config: detector settings (``config.detectors``); defaults when ``None``.
        batch_steps: steps per rank in one batch (an agent flush holds about this many).
        records: recorded run records (events, heartbeats, run starts and ends), see :func:`batches`.

    Raises:
        ReplayError: required columns missing or empty, or a column that is not numeric.
    """
    active = detectors.build((config or DaemonConfig()).detectors)
    found: list[Anomaly] = []
    for batch in batches(table, batch_steps=batch_steps, records=records):
        found.extend(detectors.run_all(active, batch))
    return found


def _seconds(value: object) -> float:
    """A time cell as Unix seconds: a number, or a timestamp (``vigil export`` writes TIMESTAMPTZ)."""
    return value.timestamp() if isinstance(value, datetime) else float(value)  # type: ignore[arg-type]


def read_records(
    events: pa.Table | None, heartbeats: pa.Table | None, world: int = 1
) -> list[tuple[Source, RunRecord]]:
    """Run records from tables shaped like the history's ``events`` and ``heartbeats`` (what
    ``vigil export --table events|heartbeats`` writes): starts, events, ends, heartbeats."""
    out: list[tuple[Source, RunRecord]] = []
    for row in events.to_pylist() if events is not None else []:
        source = Source(run_id=row["run_id"], rank=row["rank"], world_size=world)
        fields = json.loads(row["fields"]) if row.get("fields") else {}
        t = _seconds(row["time"])
        record: RunRecord
        if row["kind"] == "run_start":
            record = RunStart(time=t, config=fields.get("config") or {})
        elif row["kind"] == "run_end":
            record = RunEnd(
                time=t, status=fields.get("status", "ok"), error=fields.get("error", ""), last_step=row["step"],
                dropped=fields.get("dropped") or {},
            )  # fmt: skip
        else:
            record = RunEvent(time=t, kind=row["kind"], step=row["step"], fields=fields)
        out.append((source, record))
    for row in heartbeats.to_pylist() if heartbeats is not None else []:
        source = Source(run_id=row["run_id"], rank=row["rank"], world_size=world)
        beat = Heartbeat(
            time=_seconds(row["time"]), last_step=row.get("last_step"), buffered=row.get("buffered") or 0,
            connected=bool(row.get("connected", True)),
        )  # fmt: skip
        out.append((source, beat))
    return out


def read_directory(path: Path) -> tuple[pa.Table, list[tuple[Source, RunRecord]]]:
    """A directory holding ``steps.parquet`` and, optionally, ``events.parquet`` and
    ``heartbeats.parquet`` (``vigil export`` of each table, or a corpus run)."""
    steps = read_recording(path / "steps.parquet", "parquet")
    files = {name: path / f"{name}.parquet" for name in ("events", "heartbeats")}
    tables = {name: pq.read_table(file, **_ONE_THREAD) for name, file in files.items() if file.is_file()}
    return steps, read_records(tables.get("events"), tables.get("heartbeats"))


def replay_file(path: str | Path, fmt: str | None, config: DaemonConfig, out: TextIO) -> int:
    """``vigil replay``: one JSON line per alert update on ``out``; returns how many. A directory
    replays its ``steps.parquet`` with the run records of its ``events``/``heartbeats`` files."""
    if Path(path).is_dir():
        steps, records = read_directory(Path(path))
        found = replay_table(steps, config, records=records)
    else:
        found = replay_table(read_recording(path, fmt), config)
    out.write(render(as_result(found, REPLAY_FIELDS), "json"))
    return len(found)
