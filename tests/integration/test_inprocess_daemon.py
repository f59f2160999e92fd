"""The in-process daemon the integration tests share (``tests/_support/inprocess.py``): it is ``vigil up``'s own
``serve``, so it stores and answers as a process does; it stops as on SIGTERM; a failed start is an error of
the test's, in time, never a hang; and it leaves no thread, loop, umask or DuckDB connection behind."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import duckdb
import pytest
from inprocess import START_S, InProcessDaemon
from support import NatsServer, expected_loss, free_port, wait_for

import trainvigil
from trainvigil.daemon.broker.embedded import BrokerUnavailableError
from trainvigil.errors import ConfigError

STEPS = 300


def _send(url: str, run_id: str, steps: int = STEPS) -> None:
    """An agent in this process logs ``steps`` steps and closes once the broker has every one."""
    agent = trainvigil.init(run_id=run_id, nats_url=url, flush_interval=0.05)
    for step in range(steps):
        agent.log(step, loss=expected_loss(0, step))
    assert agent.close(timeout=30), agent.stats()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _in_file(daemon: InProcessDaemon, run_id: str) -> tuple[int, int]:
    """Steps and distinct steps of ``run_id`` in the daemon's DuckDB file, read once the daemon is gone."""
    assert daemon.config is not None
    with duckdb.connect(str(daemon.config.db_path), read_only=True) as con:
        row = con.execute("select count(*), count(distinct step) from steps where run_id = ?", [run_id]).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_it_stores_what_an_agent_sends_and_answers_sql(daemon: InProcessDaemon, nats_server: NatsServer) -> None:
    _send(nats_server.url, "stored")
    wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'stored'") == STEPS, 30, "every step")
    loss = daemon.scalar("select loss from steps where run_id = 'stored' and step = 7")
    assert loss == expected_loss(0, 7)


def test_terminate_drains_commits_and_leaves_the_file_to_duckdb(nats_server: NatsServer, tmp_path: Path) -> None:
    threads = set(threading.enumerate())
    daemon = InProcessDaemon(nats_server.url, tmp_path / "data")
    daemon.start()
    _send(nats_server.url, "drained")
    wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'drained'") == STEPS, 30, "every step")
    assert daemon.terminate() == 0
    assert _in_file(daemon, "drained") == (STEPS, STEPS)  # the file is free: no connection of the daemon's is left
    assert set(threading.enumerate()) <= threads, "the daemon's loop and its worker threads are gone"


def test_steps_sent_right_before_the_stop_are_committed_or_left_in_the_stream_never_lost(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Whatever the stop caught in hand is in the file; the rest was never acked, so the daemon started again (as
    a process daemon is: its data directory and ports) stores it."""
    daemon = InProcessDaemon(nats_server.url, tmp_path / "data")
    daemon.start()
    _send(nats_server.url, "stopped")
    assert daemon.terminate() == 0
    committed, distinct = _in_file(daemon, "stopped")
    assert committed == distinct <= STEPS
    daemon.start()
    wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'stopped'") == STEPS, 30, "the rest")
    assert daemon.terminate() == 0
    assert _in_file(daemon, "stopped") == (STEPS, STEPS)


@pytest.mark.timeout(START_S * 2)
def test_a_data_dir_that_is_a_file_is_refused_by_start_with_vigil_ups_error(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    umask, threads = _umask(), set(threading.enumerate())
    path = tmp_path / "data"
    path.write_text("not a directory")
    with pytest.raises(ConfigError, match="is a file, not a directory") as info:
        InProcessDaemon(nats_server.url, path).start()
    assert info.value.key == "data_dir"
    assert (_umask(), set(threading.enumerate()) <= threads) == (umask, True)


@pytest.mark.timeout(START_S * 2)
def test_a_start_that_fails_in_the_daemons_thread_is_raised_by_start_and_stops_the_thread(tmp_path: Path) -> None:
    umask, threads = _umask(), set(threading.enumerate())
    nobody = f"nats://127.0.0.1:{free_port()}"
    daemon = InProcessDaemon(nobody, tmp_path / "data", overrides={"connect_timeout_s": 1})
    with pytest.raises(ExceptionGroup) as info:
        daemon.start()
    assert info.group_contains(BrokerUnavailableError, match="no NATS server answered")
    daemon.close()  # the failure was raised once, by start(): the teardown has nothing more to say
    assert (_umask(), set(threading.enumerate()) <= threads) == (umask, True)


def test_two_daemons_on_two_brokers_work_side_by_side_and_the_umask_comes_back(tmp_path: Path) -> None:
    umask = _umask()
    brokers = [NatsServer(tmp_path / f"jetstream-{i}") for i in range(2)]
    daemons = [InProcessDaemon(b.url, tmp_path / f"data-{i}") for i, b in enumerate(brokers)]
    for broker in brokers:
        broker.start()
    try:
        for d in daemons:
            d.launch()
        for d in daemons:
            d.wait_ready()
        for i, broker in enumerate(brokers):
            _send(broker.url, f"run-{i}", STEPS + i)
        for i, d in enumerate(daemons):

            def stored(d: InProcessDaemon = d, i: int = i) -> bool:
                return bool(d.scalar("select count(*) from steps") == STEPS + i)

            wait_for(stored, 30, f"daemon {i}'s steps")
            assert d.scalar("select list(distinct run_id) from steps") == [f"run-{i}"]
        # Stopped in the order they started: each ``serve`` sets back the umask it found, the first one's being
        # the second's private one.
        assert [d.terminate() for d in daemons] == [0, 0]
    finally:
        for d in daemons:
            d.close()
        for broker in brokers:
            broker.stop()
    assert _umask() == umask
