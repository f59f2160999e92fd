"""A full stream never drops steps silently.

With ``discard = "new"`` (the default) a full stream refuses what an agent publishes; the
agent keeps it and retries, and once the daemon has committed and purged the backlog every
step lands. With ``discard = "old"`` the evicted messages are recorded as ``data_loss``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nats
import pytest
from support import Daemon, NatsServer, finish, run_producer, wait_for

from trainvigil.daemon.cli.cmd_runs import RUNS_SQL

pytestmark = pytest.mark.slow
MAX_BYTES = 3 * 2**20


def _stream_state(url: str) -> tuple[int, int]:
    async def main() -> tuple[int, int]:
        nc = await nats.connect(url)
        try:
            info = await nc.jetstream().stream_info("VIGIL")
            return int(info.state.bytes), int(info.state.messages)
        finally:
            await nc.close()

    return asyncio.run(main())


def test_a_full_stream_pushes_back_and_every_step_of_every_run_lands(nats_server: NatsServer, tmp_path: Path) -> None:
    env = {"VIGIL_STREAM_MAX_BYTES": str(MAX_BYTES)}
    daemon = Daemon(nats_server.url, tmp_path / "data", env=env)
    daemon.start()  # creates the small stream
    assert daemon.terminate() == 0
    flood_steps, normal_steps = 120_000, 3_000
    flood = run_producer(nats_server.url, "flood", 0, flood_steps)
    procs = [flood]
    try:
        _fill_then_drain(daemon, nats_server, procs, flood_steps, normal_steps)
    finally:
        for proc in procs:  # never leave a producer behind, whatever failed
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.kill()


def _fill_then_drain(
    daemon: Daemon, nats_server: NatsServer, procs: list[Any], flood_steps: int, normal_steps: int
) -> None:
    flood = procs[0]
    wait_for(lambda: _stream_state(nats_server.url)[0] > MAX_BYTES * 0.8, 60, "the flood to fill the stream")
    normal = run_producer(nats_server.url, "normal", 0, normal_steps)
    procs.append(normal)
    wait_for(lambda: normal.poll() is None, 5, "the normal run to be logging")
    full_bytes, _ = _stream_state(nats_server.url)
    assert full_bytes <= MAX_BYTES, "the stream never grows past its limit"
    daemon.start()  # the backlog drains, the committed part is purged, the agents' retries get in
    finish(flood, timeout=180)
    finish(normal, timeout=180)
    wait_for(
        lambda: daemon.scalar("select count(*) from steps where run_id = 'flood'") == flood_steps,
        120,
        "every step of the flooding run",
    )
    wait_for(
        lambda: daemon.scalar("select count(*) from steps where run_id = 'normal'") == normal_steps,
        60,
        "every step of the normal run",
    )
    assert daemon.scalar("select count(distinct step) from steps where run_id = 'normal'") == normal_steps
    assert daemon.scalar("select count(*) from data_loss") == 0
    wait_for(lambda: _stream_state(nats_server.url)[1] <= 1, 30, "committed messages purged from the stream")


def test_with_discard_old_evicted_steps_are_recorded_as_data_loss(nats_server: NatsServer, tmp_path: Path) -> None:
    env = {"VIGIL_STREAM_MAX_BYTES": str(MAX_BYTES), "VIGIL_STREAM_DISCARD": "old"}
    daemon = Daemon(nats_server.url, tmp_path / "data", env=env)
    daemon.start()
    assert daemon.terminate() == 0
    finish(run_producer(nats_server.url, "evicted", 0, 200_000), timeout=120)
    daemon.start()
    wait_for(lambda: daemon.scalar("select count(*) from data_loss") >= 1, 60, "the eviction to be recorded")
    lost = daemon.scalar("select sum(count) from data_loss where reason = 'evicted'")
    stored_messages = daemon.scalar("select count(*) from steps where run_id = 'evicted'")
    assert lost > 0 and 0 < stored_messages < 200_000
    assert "data_loss" in daemon.log.read_text()
    runs = daemon.sql(RUNS_SQL)
    row = dict(zip(runs.columns, next(r for r in runs.rows if r[0] == "evicted"), strict=True))
    assert int(row["maybe_lost"]) == lost, "vigil runs says the run may miss steps"
    page = "select count(*) from anomalies where detector = 'data_loss' and severity = 'page'"
    assert daemon.scalar(page) >= 1
    daemon.kill()
