"""The store when DuckDB runs out of memory mid-write: it waits, then stores every message once.

Reproduced by ``test_sql_attack_ingest_e2e.py`` on a loaded CI machine: an attack query took
DuckDB's memory while a batch was written; the batch's ROLLBACK found no memory either, so the writer's
connection stayed in an aborted transaction. The next try's ``BEGIN`` then failed with "Current
transaction is aborted", which the store took for a fault of the message: it dead-lettered a message of
real steps, then the daemon died. A COMMIT can also raise for want of memory after it committed.

The first two tests use a real DuckDB file and a seam on the writer's connection that makes one
statement fail as DuckDB does under memory pressure (the connection's state is DuckDB's own); the last
one is the real thing: queries that exhaust a small memory limit while batches are written.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import numpy as np
import pytest

from trainvigil.daemon.batch.decode import RawMessage, decode_batch
from trainvigil.daemon.ingest.isolate import write_isolating
from trainvigil.daemon.store.writer import Store
from trainvigil.errors import StoreUnavailableError

T = 1_700_000_000.0
OOM = "Out of Memory Error: failed to allocate data of size 2.0 KiB (128.5 MiB/128.0 MiB used)"


def _message(seq: int, steps: int = 10) -> RawMessage:
    """Message ``seq``: ``steps`` steps from ``(seq - 1) * steps`` and one event."""
    first = (seq - 1) * steps
    records: list[dict[str, Any]] = [
        {
            "type": "steps",
            "time": T,
            "step": np.arange(first, first + steps, dtype="<i8").tobytes(),
            "times": np.full(steps, T, dtype="<f8").tobytes(),
            "columns": {"loss": {"values": np.ones(steps, dtype="<f8").tobytes()}},
        },
        {"type": "event", "time": T, "kind": f"e{seq}"},
    ]
    data = msgspec.msgpack.encode({"v": 1, "source": {"run_id": "r"}, "records": records})
    return RawMessage("vigil.v1.r.metrics", data, seq)


class _Failing:
    """The writer's real connection, but statement ``fail_on`` raises DuckDB's out-of-memory error
    ``times`` times: before running it, or after it ran with ``after``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, fail_on: str, times: int = 1, after: bool = False) -> None:
        self.con = con
        self.fail_on = fail_on
        self.times = times
        self.after = after

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == self.fail_on and self.times:
            self.times -= 1
            if self.after:
                self.con.execute(sql, *args)
            raise duckdb.OutOfMemoryException(OOM)
        return self.con.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


class _InsertFails(Store):
    """Out of memory inside the transaction (the events' insert) while ``short``."""

    short = False

    def _write_records(self, b: Any) -> None:
        if self.short:
            raise duckdb.OutOfMemoryException(OOM)
        super()._write_records(b)


def _stored(store: Store) -> tuple[int, ...]:
    """Step rows, distinct steps, events, dead letters."""
    sql = (
        "select (select count(*) from steps), (select count(distinct step) from steps),"
        " (select count(*) from events), (select count(*) from dead_letters)"
    )
    return tuple(store.cursor().execute(sql).fetchall()[0])


def test_a_rollback_without_memory_leaves_no_aborted_transaction_behind(tmp_path: Path) -> None:
    store = _InsertFails(tmp_path / "v.duckdb")
    store.write(decode_batch([_message(1)]))
    store.short = True
    store.con = _Failing(store.con, "ROLLBACK")  # type: ignore[assignment]
    batch = decode_batch([_message(seq) for seq in range(2, 10)])
    with pytest.raises(StoreUnavailableError) as caught:
        write_isolating(store, batch)
    assert caught.value.cause == "out_of_memory"
    store.short = False
    # The memory is back; the try that failed left DuckDB's connection inside an aborted transaction.
    assert write_isolating(store, batch) == [], "nothing is dead-lettered"
    assert _stored(store) == (90, 90, 9, 0)
    assert store.last_seq == 9
    store.write(decode_batch([_message(10)]))
    assert _stored(store) == (100, 100, 10, 0)
    store.close()


def test_a_commit_that_raised_after_committing_is_not_applied_twice(tmp_path: Path) -> None:
    store = Store(tmp_path / "v.duckdb")
    store.write(decode_batch([_message(1)]))
    store.con = _Failing(store.con, "COMMIT", after=True)  # type: ignore[assignment]
    batch = decode_batch([_message(seq) for seq in range(2, 6)])
    with pytest.raises(StoreUnavailableError):
        write_isolating(store, batch)
    assert write_isolating(store, batch) == []
    assert _stored(store) == (50, 50, 5, 0), "every step and event once"
    assert store.last_seq == 5
    # The top steps were read back: steps that overlap what that commit stored are merged, not appended
    # (and message 5's event, sent again, is a resend: stored once).
    store.write(decode_batch([RawMessage(_message(5).subject, _message(5).data, 6), _message(7)]))
    assert _stored(store) == (60, 60, 6, 0)
    store.close()


def test_batches_written_while_queries_exhaust_duckdbs_memory_are_stored_once_and_whole(tmp_path: Path) -> None:
    """No seam: a reader runs a query that needs ~800 MiB against the daemon's default 128 MiB limit, again
    and again."""
    store = Store(tmp_path / "v.duckdb", memory_limit_bytes=128 * 2**20)
    stop = threading.Event()
    refused: list[int] = []  # queries that failed

    def exhaust() -> None:
        while not stop.is_set():
            con = store.cursor()
            try:
                con.execute("select list(i) from range(100000000) t(i)").fetchall()
            except duckdb.Error as exc:  # out of memory; or a write's checkpoint that found none invalidated the
                refused.append(1)  # database, which the daemon's readers report so that it is opened again
                store.invalidated_by(str(exc))
            finally:
                con.close()

    reader = threading.Thread(target=exhaust)
    reader.start()
    pauses = 0
    seq = 0
    deadline = time.monotonic() + 8
    try:
        while time.monotonic() < deadline or not refused:
            assert time.monotonic() < deadline + 30, "the reader never ran out of memory"
            batch = decode_batch([_message(seq + i + 1, steps=50) for i in range(20)])
            while True:
                try:
                    assert write_isolating(store, batch) == [], "nothing is dead-lettered"
                    break
                except StoreUnavailableError as exc:  # out of memory: wait (the daemon waits 0.5 s and more)
                    pauses += 1
                    # A write failing for good ("Catalog write-write conflict" on a view left by a write
                    # that ran out of memory) hung this test 1 run in 25 before views had names of their own.
                    assert time.monotonic() < deadline + 60, f"a write waited a minute; the last error: {exc}"
                    time.sleep(0.02)
            seq += 20
    finally:
        stop.set()
        reader.join()
    assert refused and pauses, f"memory ran out ({len(refused)} queries refused, {pauses} writes paused)"
    assert _stored(store) == (seq * 50, seq * 50, seq, 0)
    assert store.last_seq == seq
    store.close()
