"""Every acknowledged message is stored exactly once, whatever order JetStream delivers in.

A real nats-server and real ``vigil up`` processes. Out-of-order delivery is forced by fetching
from the daemon's own durable consumer while the daemon is paused (SIGSTOP), the way a message
lost in flight comes back after ``ack_wait``, behind newer ones.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import nats
import numpy as np
import pytest
from nats.js import api
from support import Daemon, NatsServer, wait_for

from trainvigil.daemon.broker.embedded import free_port
from trainvigil.daemon.broker.jetstream import ensure_stream
from trainvigil.daemon.config import StreamConfig
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.daemon.web.routes import health
from trainvigil.schemas import Column, Envelope, Source, StepBatch, encode

STREAM = StreamConfig()
BIG = 8000
"""Steps per message in the backlog: 8 float64/int64 columns x 8000 = 0.5 MB, as big as real messages get."""


def _message(run_id: str, rank: int, index: int, steps: int) -> bytes:
    """Message ``index`` of one rank: steps ``index*steps ..`` with values derived from the step."""
    step = np.arange(index * steps, (index + 1) * steps, dtype="<i8")
    times = 1.7e9 + step * 1e-3
    columns = {
        name: Column(values=(step * k + rank + 0.5).astype("<f8").tobytes())
        for k, name in enumerate(("loss", "lr", "grad_norm", "samples", "tokens", "my_custom"), start=1)
    }
    batch = StepBatch(time=float(times[-1]), step=step.tobytes(), times=times.tobytes(), columns=columns)
    return encode(Envelope(source=Source(run_id=run_id, rank=rank, world_size=8), seq=index + 1, records=[batch]))


def _publish(url: str, run_id: str, ranks: int, messages: int, steps: int, first: int = 0, **limits: Any) -> None:
    """``ranks`` producers publish ``messages`` messages each, concurrently (interleaved in the stream)."""

    async def main() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            await ensure_stream(js, StreamConfig(**limits) if limits else STREAM)

            async def producer(rank: int) -> None:
                for index in range(first, first + messages):
                    await js.publish(f"vigil.v1.{run_id}.metrics", _message(run_id, rank, index, steps))

            await asyncio.gather(*(producer(rank) for rank in range(ranks)))
        finally:
            await nc.close()

    asyncio.run(main())


async def _js_call(url: str, call: str, *args: object, **kwargs: object) -> object:
    nc = await nats.connect(url)
    try:
        return await getattr(nc.jetstream(), call)(*args, **kwargs)
    finally:
        await nc.close()


def _js(url: str, call: str, *args: object, **kwargs: object) -> object:
    """One JetStream management call (``stream_info``, ``delete_msg``, ...) on a fresh connection."""
    return asyncio.run(_js_call(url, call, *args, **kwargs))


def _steal(url: str, count: int) -> list[int]:
    """Fetch ``count`` messages from the daemon's durable consumer and never ack them."""

    async def main() -> list[int]:
        nc = await nats.connect(url)
        try:
            sub = await nc.jetstream().pull_subscribe_bind(STREAM.consumer, STREAM.name)
            msgs = await sub.fetch(count, timeout=5)
        finally:
            await nc.close()
        return [m.metadata.sequence.stream for m in msgs]

    return asyncio.run(main())


@contextmanager
def _paused(daemon: Daemon, url: str) -> Iterator[None]:
    """The daemon stopped (SIGSTOP) with no pull request of its own left waiting on the consumer."""
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGSTOP)
    try:

        def no_pull_waiting() -> bool:
            info = _js(url, "consumer_info", STREAM.name, STREAM.consumer)
            return isinstance(info, api.ConsumerInfo) and not info.num_waiting

        wait_for(no_pull_waiting, 10, "the paused daemon's pull request to expire")
        yield
    finally:
        daemon.process.send_signal(signal.SIGCONT)


@contextmanager
def _live(url: str, tmp_path: Path, run_id: str, ranks: int, messages: int, **env: str) -> Iterator[Daemon]:
    """A running daemon that has stored ``messages`` messages of 100 steps from each of ``ranks`` producers."""
    daemon = Daemon(url, tmp_path / "data", env=env)
    daemon.start()
    try:
        _publish(url, run_id, ranks, messages, 100)
        n = ranks * messages * 100
        wait_for(lambda: _rows(daemon, run_id) == (n, n), 30, f"the first {ranks * messages} messages")
        yield daemon
    finally:
        daemon.kill()


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return {name: float(value) for name, value in (ln.rsplit(" ", 1) for ln in lines if not ln.startswith("#"))}


def _metric(port: int, name: str) -> float:
    """One sample of a daemon that may not be listening yet (or any more): 0 then."""
    try:
        return _metrics(port).get(name, 0.0)
    except OSError:
        return 0.0


def _healthz(port: int) -> dict[str, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read()))


def _rows(daemon: Daemon, run_id: str) -> tuple[int, int]:
    """(rows, distinct (rank, step)) for ``run_id``, asked of the running daemon."""
    row = daemon.sql(f"select count(*), count(distinct (rank, step)) from steps where run_id = '{run_id}'").rows[0]
    return int(row[0]), int(row[1])


def _file(data_dir: Path, sql: str) -> list[tuple[object, ...]]:
    """Read the database of a daemon that has exited."""
    with duckdb.connect(str(data_dir / "vigil.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def _up_drain(url: str, data_dir: Path, http_port: int) -> list[str]:
    cli = [sys.executable, "-m", "trainvigil.daemon.cli", "up", "--nats", url, "--data-dir", str(data_dir)]
    return [*cli, "--http-port", str(http_port), "--drain"]


def _drain(url: str, data_dir: Path, timeout: float = 60) -> str:
    """``vigil up --drain`` to the end; its log."""
    result = subprocess.run(
        _up_drain(url, data_dir, 0),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


# ---- pure: what /healthz and /metrics say ----------------------------------------------------------


def test_healthz_is_degraded_with_the_reason_while_the_ingest_is_stuck() -> None:
    metrics = DaemonMetrics(broker_connected=True, stuck="ingest_stuck: the consumer owes messages")
    status, body = health(metrics)
    assert status == 503
    assert body["status"] == "degraded" and body["reasons"] == ["ingest_stuck: the consumer owes messages"]
    metrics.broker_connected = False
    _, body = health(metrics)
    assert body["reasons"][0] == "broker_disconnected"


def test_metrics_expose_redeliveries_gaps_rewinds_and_data_loss() -> None:
    metrics = DaemonMetrics(messages_skipped=4, seq_gaps=2, stuck="x")
    metrics.rewinds["gap"] += 2
    metrics.data_loss["evicted"] += 25
    text = metrics.render()
    for line in (
        "vigil_messages_skipped_total 4",
        "vigil_seq_gaps_total 2",
        'vigil_consumer_rewinds_total{reason="gap"} 2',
        'vigil_data_loss_messages_total{reason="evicted"} 25',
        "vigil_ingest_stuck 1",
    ):
        assert line in text
    fresh = DaemonMetrics().render()
    assert 'vigil_data_loss_messages_total{reason="evicted"} 0' in fresh and "vigil_ingest_stuck 0" in fresh


# ---- out of order ---------------------------------------------------------------------------------------


def test_messages_redelivered_behind_newer_ones_are_stored_exactly_once(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages fetched elsewhere come back after ack_wait behind newer ones: the old high-water
    rule skipped them as applied; now the daemon rewinds to the first one it misses."""
    monkeypatch.setenv("VIGIL_STREAM_ACK_WAIT_S", "2")
    with _live(nats_server.url, tmp_path, "ooo", 1, 20) as daemon:
        with _paused(daemon, nats_server.url):
            _publish(nats_server.url, "ooo", 1, 30, 100, first=20)
            assert _steal(nats_server.url, 10) == list(range(21, 31))
        wait_for(lambda: _rows(daemon, "ooo")[0] >= 5000, 30, "every message, the stolen ones too")
        assert _rows(daemon, "ooo") == (5000, 5000)
        assert daemon.scalar("select max(step) from steps where run_id = 'ooo'") == 4999
        metrics = _metrics(daemon.http_port)
        assert metrics["vigil_seq_gaps_total"] >= 1
        assert metrics['vigil_consumer_rewinds_total{reason="gap"}'] >= 1
        assert daemon.scalar("select count(*) from data_loss") == 0


def test_a_consumer_that_owes_messages_and_delivers_none_is_reported_and_rewound(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The newest messages fetched elsewhere, nothing after them: ack-pending for ack_wait (300 s)
    with nothing pending. The daemon calls it stuck within a few fetches and rewinds."""
    with _live(nats_server.url, tmp_path, "tail", 1, 5) as daemon:
        with _paused(daemon, nats_server.url):
            _publish(nats_server.url, "tail", 1, 5, 100, first=5)
            assert _steal(nats_server.url, 5) == [6, 7, 8, 9, 10]
        wait_for(lambda: _rows(daemon, "tail")[0] >= 1000, 20, "the stolen messages, long before ack_wait")
        assert _rows(daemon, "tail") == (1000, 1000)
        assert _metrics(daemon.http_port)['vigil_consumer_rewinds_total{reason="stuck"}'] >= 1
        assert '"ingest_stuck"' in daemon.log.read_text()
        wait_for(lambda: _healthz(daemon.http_port)["status"] == "ok", 10, "health back to ok")


def test_a_consumer_recreated_from_the_start_redelivers_everything_and_nothing_is_applied_twice(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    # The stream keeps what was committed, so the recreated consumer has something to redeliver.
    with _live(nats_server.url, tmp_path, "again", 2, 10, VIGIL_STREAM_PURGE_COMMITTED="false") as daemon:
        with _paused(daemon, nats_server.url):
            _js(nats_server.url, "delete_consumer", STREAM.name, STREAM.consumer)
            config = api.ConsumerConfig(durable_name=STREAM.consumer, ack_policy=api.AckPolicy.EXPLICIT)
            _js(nats_server.url, "add_consumer", STREAM.name, config)
        _publish(nats_server.url, "again", 2, 5, 100, first=10)
        wait_for(lambda: _rows(daemon, "again")[0] >= 3000, 30, "the 10 new messages")
        assert _rows(daemon, "again") == (3000, 3000)
        assert _metrics(daemon.http_port)["vigil_messages_skipped_total"] == 20, "each old message skipped once"


# ---- a backlog of big messages, at test size --------------------------------------------------------------

RANKS = 8


def _check_backlog(data_dir: Path, per_rank: int) -> None:
    rows = _file(
        data_dir,
        "select rank, count(*), count(distinct step), min(step), max(step), sum(loss - step - rank) "
        "from steps where run_id = 'backlog' group by rank order by rank",
    )
    n = per_rank * BIG
    assert [r[:5] for r in rows] == [(rank, n, n, 0, n - 1) for rank in range(RANKS)]
    assert all(r[5] == 0.5 * n for r in rows), "loss = step + rank + 0.5 in every row"
    assert _file(data_dir, "select count(*) from data_loss") == [(0,)]
    assert _file(data_dir, "select last_seq from ingest_offsets") == [(RANKS * per_rank,)]


@pytest.mark.slow
def test_a_backlog_of_big_messages_drains_whole_with_vigil_up_drain(nats_server: NatsServer, tmp_path: Path) -> None:
    """256 messages of 0.5 MB (2 M steps): one fetch of 256 used to overflow the broker's 64 MiB
    buffer for the connection; the overflow waited 300 s for redelivery and was then skipped."""
    per_rank = 32
    _publish(nats_server.url, "backlog", RANKS, per_rank, BIG)
    started = time.monotonic()
    log = _drain(nats_server.url, tmp_path / "data")
    elapsed = time.monotonic() - started
    _check_backlog(tmp_path / "data", per_rank)
    assert '"consumer_rewound"' not in log, "a byte-bounded fetch keeps delivery in order"
    assert elapsed < 40, f"drain took {elapsed:.1f} s (ack_wait is 300 s: a redelivery would show)"


def _drain_process(url: str, data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir.parent / "drain.log", "ab") as log:
        return subprocess.Popen(
            _up_drain(url, data_dir, port),
            stdout=log,
            stderr=log,
        )


@pytest.mark.timeout(80)  # a backlog drained by three daemons, two SIGKILLed, and a broker restart: ~25 s
@pytest.mark.slow
def test_a_backlog_drain_sigkilled_twice_and_a_broker_restart_lose_and_duplicate_nothing(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    per_rank = 20
    _publish(nats_server.url, "backlog", RANKS, per_rank, BIG)
    data = tmp_path / "data"
    steps = 'vigil_events_ingested_total{kind="steps"}'

    def committed_more_than(proc: subprocess.Popen[bytes], port: int, before: float) -> bool:
        assert proc.poll() is None, "the drain ended before it could be killed: make the backlog bigger"
        return _metric(port, steps) > before

    port = free_port()
    proc = _drain_process(nats_server.url, data, port)
    wait_for(lambda: committed_more_than(proc, port, 0), 30, "a first commit")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)

    port = free_port()
    proc = _drain_process(nats_server.url, data, port)
    wait_for(lambda: committed_more_than(proc, port, 0), 30, "a first commit after the SIGKILL")
    before = _metric(port, steps)
    nats_server.stop()
    nats_server.start()
    wait_for(lambda: committed_more_than(proc, port, before), 30, "commits after the broker restart")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)

    _drain(nats_server.url, data)
    _check_backlog(data, per_rank)


# ---- messages that are really gone ------------------------------------------------------------------------


def test_deleted_messages_become_data_loss_rows_and_everything_else_is_stored(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    _publish(nats_server.url, "del", 1, 30, 100)
    for seq in (5, 6, 17, 30):
        assert _js(nats_server.url, "delete_msg", STREAM.name, seq)
    log = _drain(nats_server.url, tmp_path / "data")
    data = tmp_path / "data"
    assert _file(data, "select first_seq, last_seq, count, reason, stream from data_loss order by 1") == [
        (5, 6, 2, "deleted", "VIGIL"),
        (17, 17, 1, "deleted", "VIGIL"),
        (30, 30, 1, "deleted", "VIGIL"),
    ]
    kept = [i for i in range(30) if i + 1 not in (5, 6, 17, 30)]
    steps = [step for (step,) in _file(data, "select step from steps order by step")]
    assert steps == [i * 100 + k for i in kept for k in range(100)]
    assert _file(data, "select last_seq from ingest_offsets") == [(30,)]
    assert log.count('"event": "data_loss"') == 3


def test_messages_evicted_by_the_streams_limits_become_data_loss_rows(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evicted while no daemon ran (max_bytes), and purged at the stream's end (nothing after)."""
    limit = 200_000  # ~28 messages of 100 steps
    monkeypatch.setenv("VIGIL_STREAM_MAX_BYTES", str(limit))
    monkeypatch.setenv("VIGIL_STREAM_DISCARD", "old")  # evict rather than refuse (the default)
    data = tmp_path / "data"
    _publish(nats_server.url, "ev", 1, 10, 100, max_bytes=limit, discard="old")
    _drain(nats_server.url, data)
    _publish(nats_server.url, "ev", 1, 40, 100, first=10, max_bytes=limit, discard="old")
    info = _js(nats_server.url, "stream_info", STREAM.name)
    assert isinstance(info, api.StreamInfo)
    first = info.state.first_seq
    assert 11 < first < 50, first
    _drain(nats_server.url, data)
    assert _file(data, "select first_seq, last_seq, count, reason from data_loss") == [
        (11, first - 1, first - 11, "evicted")
    ]
    _publish(nats_server.url, "ev", 1, 5, 100, first=50, max_bytes=limit, discard="old")
    _js(nats_server.url, "purge_stream", STREAM.name)
    _drain(nats_server.url, data)
    assert _file(data, "select first_seq, last_seq, reason from data_loss order by 1") == [
        (11, first - 1, "evicted"),
        (51, 55, "evicted"),
    ]
    kept = list(range(10)) + list(range(first - 1, 50))
    steps = [step for (step,) in _file(data, "select step from steps order by step")]
    assert steps == [i * 100 + k for i in kept for k in range(100)]
    assert _file(data, "select last_seq from ingest_offsets") == [(55,)]


def _logged_after(daemon: Daemon, first: str, then: str) -> bool:
    """Whether the daemon's log has ``then`` after its first ``first``."""
    return then in daemon.log.read_text().partition(first)[2]


def test_a_recreated_stream_is_followed_from_its_first_message_and_the_unknowable_part_recorded(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Deleted, the stream is created again by the daemon (agents may not create it) and numbers
    from 1: the daemon says so in the log, moves its offset back with a ``stream_recreated``
    data_loss row and stores every message of the new stream."""
    with _live(nats_server.url, tmp_path, "rec", 1, 10) as daemon:
        _js(nats_server.url, "delete_stream", STREAM.name)
        wait_for(lambda: '"stream_missing"' in daemon.log.read_text(), 20, "the daemon to find the stream gone")
        # The daemon, not this test's producer, makes the new stream (its own stream_created after the miss).
        after_miss = functools.partial(_logged_after, daemon, '"stream_missing"', '"stream_created"')
        wait_for(after_miss, 20, "the daemon to create the stream again")
        _publish(nats_server.url, "rec", 1, 3, 100, first=10)
        wait_for(lambda: _rows(daemon, "rec") == (1300, 1300), 30, "the new stream's messages")
        wait_for(lambda: _healthz(daemon.http_port)["status"] == "ok", 20, "/healthz to recover")
        losses = daemon.sql("select first_seq, reason from data_loss").rows
        assert losses == [[11, "stream_recreated"]] or losses == [(11, "stream_recreated")], losses
        assert daemon.scalar("select last_seq from ingest_offsets") == 3
        assert '"stream_recreated"' in daemon.log.read_text()
        _publish(nats_server.url, "rec", 1, 2, 100, first=13)
        wait_for(lambda: _rows(daemon, "rec") == (1500, 1500), 30, "messages published after the recreate")
