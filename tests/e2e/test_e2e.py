"""End to end through a real nats-server, real agent processes and a real daemon process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import CHILD_OFFSET, Daemon, NatsServer, expected_loss, finish, run_producer, wait_for

STEPS = 20_000


def _check_rows(daemon: Daemon, run_id: str, ranks: int) -> None:
    total = ranks * STEPS
    wait_for(
        lambda: daemon.scalar(f"select count(*) from steps where run_id = '{run_id}'") >= total, 60, f"{total} rows"
    )
    assert daemon.scalar(f"select count(*) from steps where run_id = '{run_id}'") == total
    assert (
        daemon.scalar(f"select count(*) from (select distinct rank, step from steps where run_id = '{run_id}')")
        == total
    )
    for rank in range(ranks):
        rows = daemon.sql(
            f"select step, loss, lr, grad_norm, tokens, extra['my_custom'] from steps "
            f"where run_id = '{run_id}' and rank = {rank} order by step"
        ).rows
        assert [r[0] for r in rows] == list(range(STEPS))
        assert all(r[1] == expected_loss(rank, r[0]) for r in rows), "loss did not round-trip exactly"
        assert all(r[2] == 1e-3 and r[3] == float(r[0] % 97) and r[4] == 4096.0 for r in rows)
        assert all(r[5] == r[0] * 0.5 for r in rows), "custom metric did not round-trip"


def test_two_agents_20k_steps_each_arrive_exactly_once(daemon: Daemon, nats_server: NatsServer) -> None:
    procs = [run_producer(nats_server.url, "two-agents", rank, STEPS) for rank in range(2)]
    for p in procs:
        finish(p)
    _check_rows(daemon, "two-agents", 2)
    assert daemon.scalar("select status from runs where run_id = 'two-agents'") == "ok"
    assert daemon.scalar("select count(*) from events where run_id = 'two-agents' and kind = 'run_end'") == 2


@pytest.mark.slow
def test_daemon_sigkilled_twice_mid_stream_loses_and_duplicates_nothing(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    daemon = Daemon(nats_server.url, tmp_path / "data")
    daemon.start()
    procs = [run_producer(nats_server.url, "killed", rank, STEPS, "--pace", "0.00005") for rank in range(2)]
    for _ in range(2):
        wait_for(lambda: daemon.scalar("select count(*) from steps") > 1000, 60, "ingest to be under way")
        daemon.kill()
        daemon.start()
    for p in procs:
        finish(p)
    _check_rows(daemon, "killed", 2)
    daemon.terminate()


@pytest.mark.serial  # the longest log() call is bounded
@pytest.mark.slow
def test_broker_down_10s_every_step_arrives_and_log_never_blocks(daemon: Daemon, nats_server: NatsServer) -> None:
    import trainvigil

    # A small memory bound forces the spill file to be used and replayed too.
    agent = trainvigil.init(
        run_id="outage",
        rank=0,
        nats_url=nats_server.url,
        flush_interval=0.05,
        max_memory_bytes=32 * 1024,
        ack_timeout=1.0,
    )
    longest = 0.0
    step = 0

    def train_for(seconds: float) -> None:
        nonlocal longest, step
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            agent.log(step, loss=expected_loss(0, step), lr=1e-3, grad_norm=1.0, samples=32.0, tokens=1.0, kl=0.1)
            longest = max(longest, time.perf_counter() - t0)
            step += 1
            time.sleep(0.001)  # the rest of a (short) training step

    train_for(1.0)
    nats_server.stop()
    outage_started = time.monotonic()
    train_for(10.0)
    assert agent.stats()["spilled_bytes"] > 0, "expected the outage to spill to disk"
    nats_server.start()
    assert time.monotonic() - outage_started >= 10.0
    train_for(1.0)
    assert agent.close(timeout=60), agent.stats()
    wait_for(
        lambda: daemon.scalar("select count(*) from steps where run_id = 'outage'") >= step,
        90,
        f"{step} steps after the outage",
    )
    assert daemon.scalar("select count(*) from steps where run_id = 'outage'") == step
    assert daemon.scalar("select max(step) from steps where run_id = 'outage'") == step - 1
    # A guard against blocking (a network wait takes 100 ms and more), not a speed target: on a
    # loaded 2-core machine one call can wait out a few of the interpreter's 5 ms switch intervals.
    assert longest < 25e-3, f"the longest log() call took {longest * 1e3:.3f} ms"
    assert agent.stats()["dropped"] == {}


def test_forked_child_steps_arrive(daemon: Daemon, nats_server: NatsServer) -> None:
    proc = run_producer(nats_server.url, "forked", 0, 500, "--fork", "300")
    finish(proc)
    wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'forked'") >= 800, 60, "800 rows")
    assert daemon.scalar(f"select count(*) from steps where run_id = 'forked' and step >= {CHILD_OFFSET}") == 300
    assert daemon.scalar(f"select count(*) from steps where run_id = 'forked' and step < {CHILD_OFFSET}") == 500
    # Parent and child each ran an agent of their own: one start and one clean end each.
    assert daemon.scalar("select count(*) from events where run_id = 'forked' and kind = 'run_start'") == 2
    assert daemon.scalar("select count(*) from events where run_id = 'forked' and kind = 'run_end'") == 2


@pytest.mark.parametrize("signal_name", ["SIGTERM"])
def test_sigterm_drains_commits_and_exits_zero(daemon: Daemon, nats_server: NatsServer, signal_name: str) -> None:
    proc = run_producer(nats_server.url, "sigterm", 0, 2000)
    finish(proc)
    wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'sigterm'") == 2000, 60, "2000 rows")
    assert daemon.terminate() == 0
