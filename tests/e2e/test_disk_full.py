"""A full disk never stops the daemon nor costs a step.

The data directory sits on a small tmpfs the test mounts (root only); agents log until it is
full, then the test grows it: the daemon pauses (``disk_full`` in its log, ``/healthz`` not
200), never exits, and once there is room stores every step exactly once.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import duckdb
import pytest
from support import Daemon, NatsServer, finish, run_producer, wait_for

from trainvigil.daemon.batch.decode import IngestBatch, RawMessage, decode_batch
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.ingest.isolate import write_isolating
from trainvigil.daemon.store.reads import ReadOnlyQueries
from trainvigil.daemon.store.writer import Store
from trainvigil.errors import StoreUnavailableError
from trainvigil.schemas import Envelope, RunEvent, Source, encode
from trainvigil.schemas.query import QueryRequest


def _can_mount() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and Path("/proc/mounts").exists()


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _can_mount(), reason="mounting a small tmpfs for the data dir needs root"),
]


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(where)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def _events(first_seq: int, n: int) -> IngestBatch:
    """``n`` run events, each with a 2 KiB field, at stream sequences from ``first_seq`` (the event's step:
    events equal in every column would be one event sent again, stored once)."""
    return decode_batch(
        [
            RawMessage("vigil.v1.r.run", encode(Envelope(source=Source(run_id="r"), records=[event])), seq)
            for seq in range(first_seq, first_seq + n)
            for event in [RunEvent(time=1.7e9, kind="k", step=seq, fields={"pad": "x" * 2048})]
        ]
    )


def _fill(where: Path) -> None:
    """Take what space is left on ``where``'s disk."""
    with (where / "filler").open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def _count(reads: ReadOnlyQueries) -> tuple[int | None, str]:
    result = anyio.run(reads.answer, QueryRequest(sql="select count(*) from events"))
    return (result.rows[0][0] if result.rows else None), result.error


@pytest.mark.parametrize("seen_by", ["writer", "reader"])
def test_a_database_duckdb_invalidated_on_a_full_disk_is_reopened_for_queries(small_fs: Path, seen_by: str) -> None:
    """DuckDB invalidates a database whose checkpoint fails for want of space, and every cursor of it
    fails from then on ("must be restarted"). Queries must not: the store is reopened for them at
    once (CI saw a query land between the failed write and the writer's next try), whether the writer
    or a reader met the invalidated database first, and the writer carries on after it."""
    store = Store(small_fs / "v.duckdb")
    reads = ReadOnlyQueries(store, DaemonConfig(data_dir=str(small_fs)))
    seq = 1
    with pytest.raises(StoreUnavailableError):
        while True:
            write_isolating(store, _events(seq, 50))
            seq += 50
    stored = store.last_seq
    _fill(small_fs)
    with pytest.raises(duckdb.FatalException):  # what DuckDB's own checkpoint after a commit meets
        store.cursor().execute("CHECKPOINT")
    if seen_by == "writer":
        with pytest.raises(StoreUnavailableError, match="invalidated"):
            write_isolating(store, _events(seq, 50))
    assert _count(reads) == (stored, ""), "queries answer from the reopened database, the disk still full"
    assert _count(reads) == (stored, "")
    (small_fs / "filler").unlink()
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True)
    assert write_isolating(store, _events(seq, 50)) == []
    assert _count(reads) == (stored + 50, "")
    store.close()


def _healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# no_floor: writes run until the disk is really full (ENOSPC). floor: a floor above the whole
# 6 MiB disk pauses ingest before the first write, deterministically, until the disk is grown.
@pytest.mark.parametrize("floor", ["0", str(64 * 2**20)], ids=["no_floor", "floor_64MiB"])
def test_full_disk_pauses_ingest_and_every_step_lands_once_space_returns(
    nats_server: NatsServer, small_fs: Path, floor: str, tmp_path: Path
) -> None:
    daemon = Daemon(nats_server.url, small_fs / "data", env={"VIGIL_STORE_MIN_FREE_BYTES": floor})
    daemon.log = tmp_path / "daemon.log"  # not on the disk that fills up
    daemon.start()
    producers = []
    try:
        steps = 120_000
        producers = [run_producer(nats_server.url, "full", rank, steps) for rank in (0, 1)]
        wait_for(lambda: "disk_full" in daemon.log.read_text(), 120, "the daemon to report the full disk")
        assert daemon.process is not None and daemon.process.poll() is None, "the daemon keeps running"
        assert wait_for(lambda: _healthz(daemon.http_port)[0] == 503, 30, "/healthz to say the store cannot write")
        if floor != "0":
            assert "below the floor" in _healthz(daemon.http_port)[1]
            assert daemon.scalar("select count(*) from steps") == 0, "paused before writing anything"
        subprocess.run(["mount", "-o", "remount,size=256m", str(small_fs)], check=True)
        for proc in producers:
            finish(proc)
        wait_for(
            lambda: daemon.scalar("select count(*) from steps where run_id = 'full'") == 2 * steps,
            120,
            "every step once the disk has room",
        )
        assert daemon.scalar("select count(distinct (rank, step)) from steps where run_id = 'full'") == 2 * steps
        assert daemon.scalar("select count(*) from dead_letters") == 0
        assert wait_for(lambda: _healthz(daemon.http_port)[0] == 200, 30, "/healthz to recover")
        assert daemon.process.poll() is None
    finally:
        for proc in producers:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.kill()
