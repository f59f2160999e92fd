"""The DuckDB store: the one writer, one transaction per batch of decoded records.

Each batch is committed together with the highest stream sequence it covers
(``ingest_offsets``), so after a crash the daemon resumes exactly after the last commit:
nothing lost, nothing applied twice. ``steps`` has one row per (run_id, rank, step);
metrics for a step that arrive in several messages are merged into that row. The schema is
:mod:`.schema`'s, the rows are built by :mod:`._arrow` and inserted by column name, and the state a
failed write leaves is :mod:`._recovery`'s; a batch refused for its content is split by ingest
(``daemon/ingest/isolate.py``), never here.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import structlog

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.store import _arrow, schema
from trainvigil.daemon.store._arrow import Columns, as_json, ts
from trainvigil.daemon.store._optim import COLUMNS as OPTIM_COLUMNS
from trainvigil.daemon.store._optim import optim_rows
from trainvigil.daemon.store._recovery import Happened, Recovery, WriterState
from trainvigil.errors import BatchUnstorableError, StoreUnavailableError
from trainvigil.schemas import KNOWN_METRICS, Anomaly, CanaryResult
from trainvigil.schemas.private import private_dir, private_file

log = structlog.get_logger("trainvigil.store")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
        self._recovery = Recovery()
        """What a failed write or an invalidated database left to settle before the next write
        (:meth:`_resume`, :meth:`_reopen`)."""
        self._schemas: dict[str, pa.Schema] = {}  # by table, for _arrow.table
        self._views = 0  # views registered so far, for their names (_registered)
        self.on_commit: Callable[[IngestBatch], None] | None = None
        """Called on the writer's thread with each batch once it is committed (the web view's live
        updates); it must return at once and never raise."""
        self._open()

    def _open(self, *, set_up: bool = True) -> None:
        """Connect; with ``set_up``, migrate the file and apply its schema. That writes (to the
        WAL), so opening again a file this store has already set up skips it: a full disk must not
        keep an invalidated database closed (a file gone meanwhile is set up anew)."""
        if not self.path.exists():
            schema.create(self.path)
            set_up = True
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
            if set_up:
                schema.set_up(con, self.path)
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
        if self._recovery.state is WriterState.INVALIDATED:
            with self._lock:
                self._reopen()
        return self.con.cursor()

    def invalidated_by(self, error: str) -> bool:
        """Whether a reader's ``error`` says DuckDB invalidated the database; if so, the next
        :meth:`cursor` (or write) opens it again."""
        found = _INVALIDATED in error
        if found:
            self._recovery(Happened.INVALIDATED)
        return found

    def close(self) -> None:
        with self._lock:
            self.con.close()

    # ---- writing -------------------------------------------------------------------------

    def write(self, batch: IngestBatch) -> None:
        """Apply ``batch`` and its offset in one transaction, then tell :attr:`on_commit`.

        ``batch`` holds decoded records of messages after the committed offset (:attr:`last_seq`),
        or none: a caller that retries a batch after a failure calls :meth:`settle` and leaves out what
        was committed (``daemon/ingest/isolate.py`` does).

        Raises:
            StoreUnavailableError: the database cannot write at all (disk full, out of memory, I/O
                error); nothing was committed unless :attr:`last_seq` moved, and the batch may be retried.
            BatchUnstorableError: the database refused what the batch holds; nothing was committed.
            ValueError: ``batch`` holds messages at or below the committed offset.
        """
        with self._lock:
            self._ready_to_write()
            if batch.raw and batch.raw[0].seq <= self.last_seq and batch.reset_offset is None:
                raise ValueError(
                    f"a batch from stream sequence {batch.raw[0].seq} on, but {self.last_seq} is committed:"
                    " call settle() first and leave out what is committed (ingest.isolate.write_isolating does)"
                )
            try:
                self._apply(batch)
            except Exception as exc:
                self._raise_if_unavailable(exc)
                raise BatchUnstorableError(str(self.path), _describe(exc)) from exc
            if self.on_commit is not None:
                self.on_commit(batch)

    def settle(self) -> None:
        """Settle what a failed write left (roll back, read the committed offset back; open an invalidated
        database again), so that :attr:`last_seq` is the committed offset: call it before choosing what to
        retry.

        Raises:
            StoreUnavailableError: the database cannot write yet.
        """
        with self._lock:
            self._ready_to_write()

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
        if self._recovery.state is not WriterState.INVALIDATED:
            return
        try:
            with contextlib.suppress(duckdb.Error):
                self.con.close()  # and the readers' cursors of it
            self._open(set_up=False)
        except duckdb.Error as exc:
            raise StoreUnavailableError(str(self.path), _describe(exc), _cause(exc)) from exc
        self._recovery(Happened.REOPENED)  # opening read the offset and the top steps back
        log.info("store_reopened", path=str(self.path), last_seq=self.last_seq)

    def _resume(self) -> None:
        """After a write that failed for want of memory or disk (under the lock): end whatever
        transaction it left open (a ROLLBACK that fails again leaves the store unsure, to try later),
        and read the offset back; if that write's COMMIT went through after all, its messages are
        skipped from now on and the top steps are read back too. The connection is kept: closing
        one left in an aborted transaction while DuckDB was out of memory crashed it (segfault)."""
        if self._recovery.state is not WriterState.UNSURE:
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
        self._recovery(Happened.RESUMED)

    def _raise_if_unavailable(self, exc: Exception) -> None:
        if _INVALIDATED in str(exc) or isinstance(exc, duckdb.FatalException):
            self._recovery(Happened.INVALIDATED)
        if self._recovery.state is not WriterState.READY or isinstance(exc, _UNAVAILABLE) or _disk_full(exc):
            self._recovery(Happened.WRITE_FAILED)  # its COMMIT may have gone through; a ROLLBACK may have failed
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
                self._recovery(Happened.WRITE_FAILED)
            # A failed statement may already have ended the transaction; the error to report is the first one.
            try:
                con.execute("ROLLBACK")
            except duckdb.Error as failed:
                if _NO_TRANSACTION not in str(failed):
                    self._recovery(Happened.WRITE_FAILED)
            raise

    def _transaction(self, batch: IngestBatch, merge: bool) -> None:
        with self._in_transaction() as con:
            if batch.steps:
                with self._registered(_arrow.steps_table(batch.steps)) as view:
                    con.execute(_merge_sql(view) if merge else f"INSERT INTO steps BY NAME SELECT * FROM {view}")
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

    def _table(self, table: str, columns: Columns) -> pa.Table:
        """``columns`` as an Arrow table of ``table``'s own column types."""
        if table not in self._schemas:  # JSON columns come as strings
            self._schemas[table] = self.con.sql(f"FROM {table} LIMIT 0").to_arrow_table().schema
        return _arrow.table(columns, self._schemas[table])

    def _insert(self, table: str, columns: Columns) -> None:
        """``columns`` into ``table`` by name, in one statement, as an Arrow table: 50x faster than
        ``executemany``, which ran a statement per row (~0.8 ms each on 2 cores). A value that does
        not fit its column raises here as it did in DuckDB, and is refused with its message."""
        if not next(iter(columns.values()), None):
            return
        with self._registered(self._table(table, columns)) as view:
            self.con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {view}")

    def _insert_once(self, table: str, columns: Columns) -> None:
        """``columns`` into ``table``, less the resent rows (by their ``time``).

        An agent sends again what it holds unacknowledged: after a lost ack, or from a spill file
        that a kill or a ``vigil push`` left half delivered, possibly days later. JetStream drops
        the copy only within its duplicate window, so a record made before :attr:`resent_after_s`
        ago that equals a stored row in every column (or another row here) is such a copy and is
        skipped; rows of the same instant that differ anywhere are all kept. Recent rows are
        appended without a lookup. The lookup reads only the stored rows within the time span of
        the old rows (DuckDB skips the row groups outside it).
        """
        horizon = datetime.fromtimestamp(time.time() - self.resent_after_s, tz=UTC)
        times = columns["time"]
        old = [i for i, t in enumerate(times) if t is not None and t < horizon]
        if not old:
            self._insert(table, columns)
            return
        if len(old) < len(times):
            recent = [i for i, t in enumerate(times) if t is None or t >= horizon]
            self._insert(table, {name: [values[i] for i in recent] for name, values in columns.items()})
        rows = {name: [values[i] for i in old] for name, values in columns.items()}
        same = " AND ".join(f"s.{c} IS NOT DISTINCT FROM n.{c}" for c in rows)
        with self._registered(self._table(table, rows)) as view:
            self.con.execute(
                f"INSERT INTO {table} BY NAME SELECT DISTINCT * FROM {view} n WHERE NOT EXISTS "
                f"(SELECT 1 FROM {table} s WHERE s.time BETWEEN ? AND ? AND {same})",
                [min(rows["time"]), max(rows["time"])],
            )

    def _write_records(self, b: IngestBatch) -> None:
        self._insert_once("events", _arrow.event_columns(b.events, b.run_starts, b.run_ends))
        self._insert_once("heartbeats", _arrow.HEARTBEATS(b.heartbeats))
        self._insert_once("gil_samples", _arrow.GIL_SAMPLES(b.gil_samples))
        self._insert_once("checkpoints", _arrow.CHECKPOINTS(b.checkpoints))
        self.write_anomalies(b.anomalies)
        self._write_canaries(b.canaries)
        optim = optim_rows(b.events)
        self._insert("optim_results", {c: [row[i] for row in optim] for i, c in enumerate(OPTIM_COLUMNS)})
        now = ts(time.time())
        letters = b.dead_letters
        self._insert(
            "dead_letters",
            {
                "time": [now] * len(letters),
                "subject": [d.subject for d in letters],
                "stream_seq": [d.seq for d in letters],
                "reason": [d.reason for d in letters],
                "error": [d.error for d in letters],
                "raw": [d.data for d in letters],
            },
        )
        self._insert(
            "data_loss",
            {
                "time": [now] * len(b.losses),
                "stream": [self.stream] * len(b.losses),
                "first_seq": [g.first for g in b.losses],
                "last_seq": [g.last for g in b.losses],
                "count": [g.count for g in b.losses],
                "reason": [g.reason for g in b.losses],
            },
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
        rows = [*anonymous, *latest.values()]
        self._insert(
            "anomalies",
            _arrow.anomaly_columns(
                rows, [opened.get(a.episode) or ts(first_time.get(a.episode, a.time)) for a in rows]
            ),
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
        self._insert("canary_results", _arrow.canary_columns(results))

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
            touch(s.run_id, start.time, s.world_size)["argv"] = as_json(start.argv)
            seen[s.run_id]["status"] = seen[s.run_id]["status"] or "running"
        for s, end in b.run_ends:
            row = touch(s.run_id, end.time, s.world_size)
            row["status"], row["ended"] = end.status, ts(end.time)
        if not seen:
            return
        runs = list(seen.values())
        columns: Columns = {
            "run_id": list(seen),
            "first_seen": [ts(r["first"]) for r in runs],
            "last_seen": [ts(r["last"]) for r in runs],
            "world_size": [r["world"] for r in runs],
            "status": [r["status"] or "running" for r in runs],
            "ended_at": [r["ended"] for r in runs],
            "argv": [r["argv"] for r in runs],
        }
        # One statement for every run of the batch (a row-by-row executemany cost 17 ms a batch at fleet scale).
        with self._registered(self._table("runs", columns)) as view:
            self.con.execute(
                f"INSERT INTO runs BY NAME SELECT * FROM {view} ON CONFLICT (run_id) DO UPDATE SET "
                "first_seen = least(runs.first_seen, excluded.first_seen), "
                "last_seen = greatest(runs.last_seen, excluded.last_seen), "
                "world_size = greatest(runs.world_size, excluded.world_size), "
                # a run_end (any rank) sets the status; otherwise keep what is there
                "status = CASE WHEN excluded.ended_at IS NOT NULL THEN excluded.status ELSE runs.status END, "
                "ended_at = coalesce(excluded.ended_at, runs.ended_at), "
                "argv = coalesce(runs.argv, excluded.argv)"
            )
