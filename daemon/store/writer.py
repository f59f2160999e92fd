"""The DuckDB store: the one writer, one transaction per fetched batch.

Each batch is committed together with the highest stream sequence it covers
(``ingest_offsets``), so after a crash the daemon resumes exactly after the last commit:
nothing lost, nothing applied twice. ``steps`` has one row per (run_id, rank, step);
metrics for a step that arrive in several messages are merged into that row.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import numpy as np
import pyarrow as pa
import structlog

from trainvigil.daemon.batch.decode import DeadLetter, IngestBatch, RawMessage, StepColumns, decode_batch
from trainvigil.daemon.store._optim import optim_rows
from trainvigil.errors import ConfigError, StoreUnavailableError
from trainvigil.schemas import KNOWN_METRICS, Anomaly, CanaryResult
from trainvigil.schemas.private import private_dir, private_file

log = structlog.get_logger("trainvigil.store")

SCHEMA_VERSION = 4
"""1: times as naive UTC ``TIMESTAMP``. 2: times as ``TIMESTAMPTZ``, comments on every table and
column, the ``run_summary`` and ``open_alerts`` views. 3: ``canary_results`` gains the verdict and
its evidence (``_CANARY_V3``). 4: ``optim_results``, rows materialised from ``optim_result`` events
(a new table, which ``schema.sql`` creates in an older file too). ``_migrate`` brings older files up to date."""
STORAGE_VERSION = "v1.4.0"
"""DuckDB storage format of new files: DuckDB 1.4.0 and newer read it (the 1.4 LTS and 1.5 CLIs
among them), while the default of the DuckDB we run (2.0) is unreadable for every 1.x release."""
SCHEMA_SQL = (resources.files(__package__) / "schema.sql").read_text(encoding="utf-8")
"""Tables, comments and views; idempotent, run on every open."""
_TABLES = (
    "schema_info",
    "runs",
    "steps",
    "events",
    "heartbeats",
    "gil_samples",
    "checkpoints",
    "anomalies",
    "canary_results",
    "optim_results",
    "dead_letters",
    "data_loss",
    "ingest_offsets",
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CANARY_V3 = (
    ("workload", "VARCHAR"),
    ("verdict", "VARCHAR"),
    ("fired_detector", "VARCHAR"),
    ("latency_s", "DOUBLE"),
    ("exit_code", "INTEGER"),
    ("duration_s", "DOUBLE"),
)
"""Columns schema version 3 appends to ``canary_results`` (as ``schema.sql`` creates them in a new file)."""

_STEP_FIELDS = ["run_id", "rank", "step", "time", *KNOWN_METRICS, "extra"]
_EXTRA_TYPE = pa.map_(pa.string(), pa.float64())


def _merge_sql(batch: str) -> str:
    """Fold the steps of view ``batch`` into rows already stored: per metric the latest non-NULL
    value wins (stream order), custom-metric maps are merged key by key."""
    return f"""
CREATE TEMP TABLE {batch}_merged AS
SELECT run_id, rank, step, max(time) AS time,
       {", ".join(f"arg_max({m}, _ord) FILTER (WHERE {m} IS NOT NULL) AS {m}" for m in KNOWN_METRICS)},
       list_reduce(list(extra ORDER BY _ord) FILTER (WHERE extra IS NOT NULL), lambda a, b: map_concat(a, b))
           AS extra
FROM (
    SELECT s.*, 0 AS _ord FROM steps s SEMI JOIN {batch} b USING (run_id, rank, step)
    UNION ALL BY NAME
    SELECT *, row_number() OVER () AS _ord FROM {batch}
)
GROUP BY run_id, rank, step;
DELETE FROM steps USING {batch}_merged m
    WHERE steps.run_id = m.run_id AND steps.rank = m.rank AND steps.step = m.step;
INSERT INTO steps BY NAME SELECT * FROM {batch}_merged;
DROP TABLE {batch}_merged;
"""


_UNAVAILABLE = (
    duckdb.IOException,
    duckdb.OutOfMemoryException,
    duckdb.FatalException,
    duckdb.TransactionException,
    OSError,
)
"""Errors of the database or the disk, not of a message: retried later, never dead-lettered. A
transaction error is the connection's state (a transaction a failed ROLLBACK left aborted, a
conflict), never what a message holds."""
_NO_TRANSACTION = "no transaction is active"
"""DuckDB's words for a ROLLBACK after the failed statement already ended the transaction."""
_INVALIDATED = "database has been invalidated"
"""DuckDB's words once a fatal error (a checkpoint that met a full disk) has invalidated the
database: every connection to it fails until it is opened again."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def _disk_full(exc: BaseException) -> bool:
    text = str(exc)
    return "No space left" in text or "Could not write" in text


def _cause(exc: BaseException) -> str:
    """What keeps the store from writing, for the page and ``/healthz``."""
    if isinstance(exc, duckdb.OutOfMemoryException):
        return "out_of_memory"
    return "disk_full" if _disk_full(exc) else "io_error"


def _ts(seconds: float | None) -> datetime | None:
    """Unix seconds as an aware UTC datetime (DuckDB TIMESTAMPTZ: the instant, whatever the session's zone)."""
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)


def _json(value: Any) -> str:
    return msgspec.json.encode(value, enc_hook=repr).decode()


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
    return pa.Table.from_arrays([columns[name] for name in _STEP_FIELDS], names=_STEP_FIELDS)


def _create(path: Path) -> None:
    """An empty database file in ``STORAGE_VERSION``; DuckDB keeps a file's format as it writes on.

    Made through ``ATTACH ... (STORAGE_VERSION)``, not the ``storage_compatibility_version``
    setting of the daemon's connection: that setting also limits what the connection serializes,
    and the SQL sandbox must serialize every statement it judges (a write hidden in a CTE included).
    """
    with duckdb.connect() as con:
        con.execute("ATTACH '{}' AS fresh (STORAGE_VERSION '{}')".format(str(path).replace("'", "''"), STORAGE_VERSION))


def _migrate(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Bring a file written by an older trainvigil up to ``SCHEMA_VERSION``, in one transaction.

    Runs before ``SCHEMA_SQL``; a new file (no ``schema_info``) has nothing to migrate. The storage
    format of an existing file stays what it was (docs/operations/upgrades.md says how to rewrite it for older CLIs).

    Raises:
        ConfigError: the file was written by a newer trainvigil.
    """
    known = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name = 'schema_info'"
    ).fetchall()[0][0]
    if not known:
        return
    version = con.execute("SELECT max(version) FROM schema_info").fetchall()[0][0] or 1
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"data_dir: {path} holds schema version {version}, newer than this trainvigil's {SCHEMA_VERSION}; "
            "upgrade trainvigil or pass another --data-dir",
            key="data_dir",
        )
    if version == SCHEMA_VERSION:
        return
    con.execute("BEGIN TRANSACTION")
    try:
        if version < 2:
            # Version 1 stored naive UTC times; as TIMESTAMPTZ they are the same instants.
            naive = con.execute(
                "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = current_database() "
                "AND schema_name = 'main' AND list_contains(?, table_name) AND data_type = 'TIMESTAMP'",
                [list(_TABLES)],
            ).fetchall()
            for table, column in naive:
                con.execute(
                    f'ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE TIMESTAMPTZ '
                    f"USING timezone('UTC', \"{column}\")"
                )
        if version < 3:
            for column, kind in _CANARY_V3:
                con.execute(f"ALTER TABLE canary_results ADD COLUMN IF NOT EXISTS {column} {kind}")
            # Rows of the old schema only knew ``passed``.
            con.execute("UPDATE canary_results SET verdict = CASE WHEN passed THEN 'pass' ELSE 'fail' END")
        # Version 4 only adds optim_results, which SCHEMA_SQL creates; before it no event made a row.
        con.execute("UPDATE schema_info SET version = ?", [SCHEMA_VERSION])
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    log.info("store_migrated", path=str(path), from_version=version, to_version=SCHEMA_VERSION)


class Store:
    """The daemon's DuckDB database. Only the ingest stage writes; queries use cursors."""

    def __init__(
        self,
        path: Path,
        consumer: str = "vigil-daemon",
        stream: str = "VIGIL",
        *,
        min_free_bytes: int = 0,
        memory_limit_bytes: int = 0,
        duplicate_window_s: float = 120.0,
    ) -> None:
        # The history holds every run's command line (``run_start``), secrets passed as arguments with it.
        if why := private_dir(path.parent):
            log.warning("data_dir_not_private", reason=why)
        self.path = path
        self.consumer = consumer
        self.stream = stream
        self.min_free_bytes = min_free_bytes
        """Below this much free space on the data directory's disk, writes pause (queries and
        DuckDB's own checkpoint still need room)."""
        self.resent_after_s = duplicate_window_s / 2
        """A record made longer ago than this may come again in a message JetStream no longer knows
        (its duplicate window, ``stream.duplicate_window_s``, is twice this: half of it for clocks
        that differ): such records are looked up before they are stored (:meth:`_insert_once`)."""
        # No file or network access from SQL, and nobody can turn it back on (the configuration
        # is locked once open). Background allocator threads hand memory of interrupted queries
        # back to the system at once. ``memory_limit`` bounds DuckDB as a whole: queries spill
        # or fail past it, and a write that finds no memory waits (never dead-lettered).
        self._config: dict[str, str | bool | int | float | list[str]] = {
            "enable_external_access": False,
            "allocator_background_threads": True,
        }
        if memory_limit_bytes:
            self._config["memory_limit"] = f"{memory_limit_bytes}B"
        self._lock = threading.Lock()
        self._invalidated = False
        self._unsure = False
        """A write failed for want of memory or disk: its connection may be stuck in an aborted
        transaction, and its COMMIT may have committed though it raised (DuckDB does both when out
        of memory). The next write first rolls back on it and reads the offset back (:meth:`_resume`)."""
        self._schemas: dict[str, pa.Schema] = {}  # by table, for _insert
        self._views = 0  # views registered so far, for their names (_registered)
        self.on_commit: Callable[[IngestBatch], None] | None = None
        """Called on the writer's thread with each batch once it is committed (the web view's live
        updates); it must return at once and never raise."""
        self._open()

    def _open(self, *, schema: bool = True) -> None:
        """Connect; with ``schema``, migrate the file and apply ``SCHEMA_SQL``. That writes (to the
        WAL), so opening again a file this store has already set up skips it: a full disk must not
        keep an invalidated database closed (a file gone meanwhile is set up anew)."""
        if not self.path.exists():
            _create(self.path)
            schema = True
        # Made private on every open: a file an older version (or another umask) left readable. New ones,
        # the WAL DuckDB creates again after each checkpoint among them, are private by the daemon's umask.
        for path in (self.path, self.path.with_name(self.path.name + ".wal")):
            if why := private_file(path):
                log.warning("history_not_private", reason=why)
        con = duckdb.connect(
            str(self.path),
            config=self._config,
        )
        # Times shown as text (``vigil sql`` answers, casts, date_trunc) do not depend on the host's
        # zone. Set before the lock: the time-zone extension is not loaded yet when ``config`` applies.
        try:
            con.execute("SET GLOBAL TimeZone = 'UTC'")
            con.execute("SET GLOBAL lock_configuration = true")
            if schema:
                _migrate(con, self.path)
                con.execute(SCHEMA_SQL)
                if not con.execute("SELECT count(*) FROM schema_info").fetchall()[0][0]:
                    con.execute("INSERT INTO schema_info VALUES (?)", [SCHEMA_VERSION])
        except BaseException:
            con.close()  # let go of the file: the caller may report and exit, or try again later
            raise
        self.con = con
        """The writer's connection; readers get cursors of it (:meth:`cursor`)."""
        self.last_seq = self._load_offset()
        self._max_step = self._load_tops()

    def _load_tops(self) -> dict[tuple[str, int], int]:
        """Highest step stored per (run, rank): a batch whose steps all lie above it (and rise within
        it) cannot touch an existing row, so it is appended without any per-row key lookup. Anything
        else takes the merge path."""
        rows = self.con.execute("SELECT run_id, rank, max(step) FROM steps GROUP BY ALL").fetchall()
        return {(run, rank): int(top) for run, rank, top in rows}

    def _load_offset(self) -> int:
        rows = self.con.execute(
            "SELECT last_seq FROM ingest_offsets WHERE consumer = ? AND stream = ?", [self.consumer, self.stream]
        ).fetchall()
        return int(rows[0][0]) if rows else 0

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection to the same database, for a reader on another thread.

        A database DuckDB invalidated (a checkpoint that met a full disk) is opened again first, which
        may wait for a commit in progress: call this off the event loop.

        Raises:
            StoreUnavailableError: the database was invalidated and cannot be opened again yet.
        """
        if self._invalidated:
            with self._lock:
                self._reopen()
        return self.con.cursor()

    def invalidated_by(self, error: str) -> bool:
        """Whether a reader's ``error`` says DuckDB invalidated the database; if so, the next
        :meth:`cursor` (or write) opens it again."""
        found = _INVALIDATED in error
        if found:
            self._invalidated = True
        return found

    def close(self) -> None:
        with self._lock:
            self.con.close()

    # ---- writing -------------------------------------------------------------------------

    def write(self, batch: IngestBatch) -> list[DeadLetter]:
        """Apply ``batch`` and its offset in one transaction; never fails on what a message holds.

        A batch the database refuses because of its content (a value out of a column's range,
        anything the wire check let through) is split by message and retried, so only the
        message(s) at fault are refused: each becomes a ``dead_letters`` row (``unstorable``,
        with the database's error) committed with its sequence, and everything else is
        stored. Messages at or below the committed offset are already applied and skipped,
        so calling ``write`` again with the same batch after a failure stores nothing twice.

        Returns the dead letters made here. Raises:
            StoreUnavailableError: the database cannot write at all (disk full, I/O error);
                nothing more was committed and the same batch may be retried later.
        """
        with self._lock:
            self._ready_to_write()
            pending = self._unapplied(batch)
            try:
                self._apply(pending)
                if self.on_commit is not None:
                    self.on_commit(pending)
                return []
            except Exception as exc:
                self._raise_if_unavailable(exc)
                log.warning("batch_unstorable", error=_describe(exc), messages=len(pending.raw))
            refused: list[DeadLetter] = []
            if len(pending.raw) > 1:
                half = len(pending.raw) // 2
                self._isolate(pending.raw[:half], refused)
                self._isolate(pending.raw[half:], refused)
            elif pending.raw:
                self._isolate(pending.raw, refused)
            tail = IngestBatch(
                anomalies=pending.anomalies[pending.wire_anomalies :],
                losses=pending.losses,
                max_seq=max(self.last_seq, pending.max_seq),
            )
            try:
                self._apply(tail)
            except Exception as exc:
                self._raise_if_unavailable(exc)
                log.error("alerts_unstorable", error=_describe(exc), anomalies=len(tail.anomalies))
            return refused

    def _unapplied(self, batch: IngestBatch) -> IngestBatch:
        """``batch`` without the messages a partial commit of an earlier try already applied."""
        if not batch.raw or batch.raw[0].seq > self.last_seq or batch.reset_offset is not None:
            return batch
        rest = decode_batch([m for m in batch.raw if m.seq > self.last_seq])
        rest.anomalies.extend(batch.anomalies[batch.wire_anomalies :])
        rest.losses = batch.losses
        rest.max_seq = max(rest.max_seq, batch.max_seq, self.last_seq)
        rest.now = batch.now
        return rest

    def _isolate(self, msgs: list[RawMessage], refused: list[DeadLetter]) -> None:
        """Commit ``msgs`` in halves, in sequence order, down to the single messages at fault."""
        try:
            self._apply(decode_batch(msgs))
            return
        except Exception as exc:
            self._raise_if_unavailable(exc)
            if len(msgs) > 1:
                half = len(msgs) // 2
                self._isolate(msgs[:half], refused)
                self._isolate(msgs[half:], refused)
                return
            error = _describe(exc)
        m = msgs[0]
        letter = DeadLetter(m.subject, m.seq, "unstorable", error, m.data)
        log.warning("dead_letter", subject=m.subject, seq=m.seq, reason="unstorable", error=error)
        self._apply(IngestBatch(dead_letters=[letter], max_seq=m.seq))
        refused.append(letter)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path.parent).free

    def _ready_to_write(self) -> None:
        """Raise StoreUnavailableError while the disk is below the floor or an invalidated database
        cannot be opened again."""
        if self.min_free_bytes:
            free = self.free_bytes()
            if free < self.min_free_bytes:
                raise StoreUnavailableError(
                    str(self.path),
                    f"{free} bytes free, below the floor of {self.min_free_bytes} (store.min_free_bytes)",
                    "disk_full",
                )
        self._reopen()
        self._resume()

    def _reopen(self) -> None:
        """Open the database again if DuckDB invalidated it after an I/O error (under the lock)."""
        if not self._invalidated:
            return
        try:
            with contextlib.suppress(duckdb.Error):
                self.con.close()  # and the readers' cursors of it
            self._open(schema=False)
        except duckdb.Error as exc:
            raise StoreUnavailableError(str(self.path), _describe(exc), _cause(exc)) from exc
        self._invalidated = False
        self._unsure = False  # opening read the offset and the top steps back
        log.info("store_reopened", path=str(self.path), last_seq=self.last_seq)

    def _resume(self) -> None:
        """After a write that failed for want of memory or disk (under the lock): end whatever
        transaction it left open (a ROLLBACK that fails again leaves the store unsure, to try later),
        and read the offset back; if that write's COMMIT went through after all, its messages are
        skipped from now on and the top steps are read back too. The connection is kept: closing
        one left in an aborted transaction while DuckDB was out of memory crashed it (segfault)."""
        if not self._unsure:
            return
        try:
            try:
                self.con.execute("ROLLBACK")
            except duckdb.TransactionException as exc:
                if _NO_TRANSACTION not in str(exc):
                    raise
            committed = self._load_offset()
            if committed != self.last_seq:
                self._max_step = self._load_tops()
                self.last_seq = committed
        except duckdb.Error as exc:
            raise StoreUnavailableError(str(self.path), _describe(exc), _cause(exc)) from exc
        self._unsure = False

    def _raise_if_unavailable(self, exc: Exception) -> None:
        if self.invalidated_by(str(exc)) or isinstance(exc, duckdb.FatalException):
            self._invalidated = True
        if self._invalidated or self._unsure or isinstance(exc, _UNAVAILABLE) or _disk_full(exc):
            self._unsure = True  # its COMMIT may have gone through; a ROLLBACK may have failed
            raise StoreUnavailableError(str(self.path), _describe(exc), _cause(exc)) from exc

    def _apply(self, batch: IngestBatch) -> None:
        tops = self._append_only(batch)
        self._transaction(batch, merge=tops is None)
        if tops is None:
            tops = self._tops_after_merge(batch)
        self._max_step.update(tops)
        self.last_seq = self._next_offset(batch)

    def _next_offset(self, batch: IngestBatch) -> int:
        return batch.reset_offset if batch.reset_offset is not None else max(self.last_seq, batch.max_seq)

    def _append_only(self, batch: IngestBatch) -> dict[tuple[str, int], int] | None:
        """New per-(run, rank) top steps if every step of ``batch`` is new and rising, else None."""
        tops: dict[tuple[str, int], int] = {}
        for part in batch.steps:
            if not len(part):
                continue
            key = (part.source.run_id, part.source.rank)
            top = tops.get(key, self._max_step.get(key, -(2**63)))
            if part.step[0] <= top or (len(part) > 1 and not bool(np.all(np.diff(part.step) > 0))):
                return None
            tops[key] = int(part.step[-1])
        return tops

    def _tops_after_merge(self, batch: IngestBatch) -> dict[tuple[str, int], int]:
        tops: dict[tuple[str, int], int] = {}
        for part in batch.steps:
            if len(part):
                key = (part.source.run_id, part.source.rank)
                tops[key] = max(tops.get(key, self._max_step.get(key, -(2**63))), int(part.step.max()))
        return tops

    @contextlib.contextmanager
    def _in_transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """BEGIN, the body, COMMIT on the writer's connection; ROLLBACK when either raises. A ROLLBACK
        that fails too (out of memory) leaves the transaction open and aborted, and a COMMIT that
        raised may have committed: the store is then unsure, and its next write first resumes
        (:meth:`_resume`)."""
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException as exc:
            if isinstance(exc, _UNAVAILABLE):
                self._unsure = True
            # A failed statement may already have ended the transaction; the error to report is the first one.
            try:
                con.execute("ROLLBACK")
            except duckdb.Error as failed:
                if _NO_TRANSACTION not in str(failed):
                    self._unsure = True
            raise

    def _transaction(self, batch: IngestBatch, merge: bool) -> None:
        with self._in_transaction() as con:
            if batch.steps:
                with self._registered(steps_table(batch.steps)) as view:
                    con.execute(_merge_sql(view) if merge else f"INSERT INTO steps SELECT * FROM {view}")
            self._write_records(batch)
            self._write_runs(batch)
            # The offset only moves forward, except on a recreated stream (reset_offset).
            con.execute(
                "INSERT INTO ingest_offsets VALUES (?, ?, ?, now()) "
                "ON CONFLICT (consumer) DO UPDATE SET last_seq = CASE WHEN ? THEN excluded.last_seq"
                " ELSE greatest(ingest_offsets.last_seq, excluded.last_seq) END,"
                " stream = excluded.stream, updated_at = excluded.updated_at",
                [self.consumer, self.stream, self._next_offset(batch), batch.reset_offset is not None],
            )

    @contextlib.contextmanager
    def _registered(self, table: pa.Table) -> Iterator[str]:
        """``table`` as a view of the writer's connection, under a name never used before. With one
        name for every batch, a write that ran out of memory at the wrong moment once left DuckDB
        refusing every later view of that name ("Catalog write-write conflict on create"), rollbacks
        notwithstanding: the daemon stopped storing anything, for good."""
        self._views += 1
        name = f"_vigil_view_{self._views}"
        self.con.register(name, table)
        try:
            yield name
        finally:
            with contextlib.suppress(duckdb.Error):  # a failed transaction is rolled back, now or next write
                self.con.unregister(name)

    def _insert(self, table: str, rows: list[tuple[Any, ...]]) -> None:
        """``rows`` (tuples in ``table``'s column order) in one statement, as an Arrow table: 50x
        faster than ``executemany``, which ran a statement per row (~0.8 ms each on 2 cores). A value
        that does not fit its column raises here as it did in DuckDB, and is refused with its message."""
        if not rows:
            return
        with self._registered(self._arrow(table, rows)) as view:
            self.con.execute(f"INSERT INTO {table} SELECT * FROM {view}")

    def _arrow(self, table: str, rows: list[tuple[Any, ...]]) -> pa.Table:
        """``rows`` as an Arrow table of ``table``'s own column types."""
        schema = self._schema(table)
        arrays = [pa.array(column, type=f.type) for column, f in zip(zip(*rows, strict=True), schema, strict=True)]
        return pa.Table.from_arrays(arrays, schema=schema)

    def _insert_once(self, table: str, rows: list[tuple[Any, ...]], at: int = 2) -> None:
        """``rows`` into ``table`` (column ``at`` the record's time), less the resent ones.

        An agent sends again what it holds unacknowledged: after a lost ack, or from a spill file
        that a kill or a ``vigil push`` left half delivered, possibly days later. JetStream drops
        the copy only within its duplicate window, so a record made before :attr:`resent_after_s`
        ago that equals a stored row in every column (or another row here) is such a copy and is
        skipped; rows of the same instant that differ anywhere are all kept. Recent rows are
        appended without a lookup. The lookup reads only the stored rows within the time span of
        the old rows (DuckDB skips the row groups outside it).
        """
        horizon = datetime.fromtimestamp(time.time() - self.resent_after_s, tz=UTC)
        old = [row for row in rows if row[at] is not None and row[at] < horizon]
        if not old:
            self._insert(table, rows)
            return
        if len(old) < len(rows):
            self._insert(table, [row for row in rows if row[at] is None or row[at] >= horizon])
        same = " AND ".join(f"s.{c} IS NOT DISTINCT FROM n.{c}" for c in self._schema(table).names)
        with self._registered(self._arrow(table, old)) as view:
            self.con.execute(
                f"INSERT INTO {table} SELECT DISTINCT * FROM {view} n WHERE NOT EXISTS "
                f"(SELECT 1 FROM {table} s WHERE s.time BETWEEN ? AND ? AND {same})",
                [min(row[at] for row in old), max(row[at] for row in old)],
            )

    def _schema(self, table: str) -> pa.Schema:
        """``table``'s columns as Arrow types (JSON columns as strings)."""
        if table not in self._schemas:
            self._schemas[table] = self.con.sql(f"FROM {table} LIMIT 0").to_arrow_table().schema
        return self._schemas[table]

    def _write_records(self, b: IngestBatch) -> None:
        self._insert_once(
            "events",
            [(s.run_id, s.rank, _ts(e.time), e.kind, e.step, _json(e.fields)) for s, e in b.events]
            + [
                (s.run_id, s.rank, _ts(r.time), "run_start", None, _json({"argv": r.argv, "config": r.config}))
                for s, r in b.run_starts
            ]
            + [
                (
                    s.run_id,
                    s.rank,
                    _ts(r.time),
                    "run_end",
                    r.last_step,
                    _json({"status": r.status, "dropped": r.dropped, **({"error": r.error} if r.error else {})}),
                )
                for s, r in b.run_ends
            ],
        )
        self._insert_once(
            "heartbeats",
            [
                (
                    s.run_id,
                    s.rank,
                    s.host,
                    s.pid,
                    _ts(h.time),
                    h.last_step,
                    h.buffered,
                    h.spilled_bytes,
                    h.connected,
                    _json(h.dropped),
                )
                for s, h in b.heartbeats
            ],
            at=4,
        )
        self._insert_once(
            "gil_samples",
            [
                (
                    s.run_id,
                    s.rank,
                    _ts(g.time),
                    g.period,
                    g.samples,
                    g.wait_p50,
                    g.wait_p90,
                    g.wait_p99,
                    g.wait_max,
                    g.busy_share,
                    g.wait_share,
                    g.held,
                    g.switch_interval,
                    g.gil_enabled,
                    _json(g.threads),
                )
                for s, g in b.gil_samples
            ],
        )
        self._insert_once(
            "checkpoints",
            [
                (s.run_id, s.rank, _ts(c.time), c.step, c.origin, c.path, c.algo, c.root, c.ok, _json(c.tensors))
                for s, c in b.checkpoints
            ],
        )
        self.write_anomalies(b.anomalies)
        self._write_canaries(b.canaries)
        self._insert("optim_results", optim_rows(b.events))
        self._insert(
            "dead_letters",
            [(_ts(time.time()), d.subject, d.seq, d.reason, d.error, d.data) for d in b.dead_letters],
        )
        self._insert(
            "data_loss",
            [(_ts(time.time()), self.stream, g.first, g.last, g.count, g.reason) for g in b.losses],
        )

    def write_anomalies(self, anomalies: list[Anomaly]) -> None:
        """One row per alert episode: an update (escalated, cleared) replaces the episode's row."""
        latest: dict[str, Anomaly] = {}
        first_time: dict[str, float] = {}
        anonymous: list[Anomaly] = []
        for a in anomalies:
            if a.episode:
                latest[a.episode] = a
                first_time.setdefault(a.episode, a.time)
            else:
                anonymous.append(a)
        updates = [a.episode for a in latest.values() if a.state != "open"]
        opened: dict[str, Any] = {}
        if updates:
            # The row keeps the time the episode opened; ``updated_at`` says when it last changed.
            # As integers: fetching a TIMESTAMPTZ as a datetime would need pytz.
            opened = {
                episode: _EPOCH + timedelta(microseconds=us)
                for episode, us in self.con.execute(
                    "SELECT episode, epoch_us(time) FROM anomalies WHERE list_contains(?, episode)", [updates]
                ).fetchall()
            }
            self.con.execute("DELETE FROM anomalies WHERE list_contains(?, episode)", [updates])
        self._insert(
            "anomalies",
            [
                (
                    a.run_id,
                    a.rank,
                    a.step,
                    opened.get(a.episode) or _ts(first_time.get(a.episode, a.time)),
                    a.detector,
                    a.severity,
                    a.state,
                    a.value,
                    a.baseline,
                    a.threshold,
                    a.message,
                    a.episode or None,
                    a.last_step,
                    _ts(a.time),
                )
                for a in [*anonymous, *latest.values()]
            ],
        )

    def record_canary(self, result: CanaryResult, alerts: list[Anomaly]) -> None:
        """A canary's verdict and the alerts it raises (``canary_failed``), in one transaction.

        The canary runner's path into the one writer: the same connection and lock as ingest, so
        a verdict is committed whatever ingest is doing (also while the daemon shuts down).

        Raises:
            StoreUnavailableError: the database cannot write (disk full, I/O error).
        """
        with self._lock:
            self._ready_to_write()
            try:
                with self._in_transaction():
                    self._write_canaries([result])
                    self.write_anomalies(alerts)
            except Exception as exc:
                self._raise_if_unavailable(exc)
                raise

    def _write_canaries(self, results: list[CanaryResult]) -> None:
        self._insert(
            "canary_results",
            [
                (
                    _ts(c.time),
                    c.name,
                    c.fault,
                    c.passed,
                    c.expected_detector,
                    c.fault_step,
                    c.fired_step,
                    c.latency_steps,
                    c.detail,
                    c.workload,
                    c.verdict or ("pass" if c.passed else "fail"),
                    c.fired_detector,
                    c.latency_s,
                    c.exit_code,
                    c.duration_s,
                )
                for c in results
            ],
        )

    def _write_runs(self, b: IngestBatch) -> None:
        """Upsert one row per run seen in this batch."""
        seen: dict[str, dict[str, Any]] = {}

        def touch(run_id: str, t: float, world_size: int) -> dict[str, Any]:
            row = seen.setdefault(
                run_id, {"first": t, "last": t, "world": world_size, "status": None, "ended": None, "argv": None}
            )
            row["first"] = min(row["first"], t)
            row["last"] = max(row["last"], t)
            row["world"] = max(row["world"], world_size)
            return row

        for part in b.steps:
            if len(part):
                touch(part.source.run_id, float(part.times.min()), part.source.world_size)
                touch(part.source.run_id, float(part.times.max()), part.source.world_size)
        for s, rec in [*b.events, *b.heartbeats, *b.gil_samples, *b.checkpoints]:
            touch(s.run_id, rec.time, s.world_size)
        for s, start in b.run_starts:
            touch(s.run_id, start.time, s.world_size)["argv"] = _json(start.argv)
            seen[s.run_id]["status"] = seen[s.run_id]["status"] or "running"
        for s, end in b.run_ends:
            row = touch(s.run_id, end.time, s.world_size)
            row["status"], row["ended"] = end.status, _ts(end.time)
        rows = [
            (run, _ts(r["first"]), _ts(r["last"]), r["world"], r["status"] or "running", r["ended"], r["argv"])
            for run, r in seen.items()
        ]
        if rows:
            # One statement for every run of the batch (a row-by-row executemany cost 17 ms a batch at fleet scale).
            with self._registered(self._arrow("runs", rows)) as view:
                self.con.execute(
                    f"INSERT INTO runs SELECT * FROM {view} ON CONFLICT (run_id) DO UPDATE SET "
                    "first_seen = least(runs.first_seen, excluded.first_seen), "
                    "last_seen = greatest(runs.last_seen, excluded.last_seen), "
                    "world_size = greatest(runs.world_size, excluded.world_size), "
                    # a run_end (any rank) sets the status; otherwise keep what is there
                    "status = CASE WHEN excluded.ended_at IS NOT NULL THEN excluded.status ELSE runs.status END, "
                    "ended_at = coalesce(excluded.ended_at, runs.ended_at), "
                    "argv = coalesce(runs.argv, excluded.argv)"
                )
