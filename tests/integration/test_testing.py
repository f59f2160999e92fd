"""``trainvigil.testing``, the harness the project's tests and benchmarks share and users may use for theirs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from inprocess import InProcessDaemon

import trainvigil
from trainvigil.testing import STEPS_SERIES, NatsCluster, memory_mib, scrape, steps_committed, wait_until


def test_wait_until_returns_the_first_truthy_value_and_times_out_naming_what_and_the_last_value() -> None:
    seen = iter([0, None, 7])
    assert wait_until(lambda: next(seen), 5, "a seven", interval=0.001) == 7
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"after 0\.05 s waiting for the answer \(last: ''\)"):
        wait_until(lambda: "", 0.05, "the answer", interval=0.01)
    assert time.monotonic() - started < 30  # a guard against blocking, far above its 0.05 s


def test_a_cluster_used_as_a_context_manager_elects_a_jetstream_leader_and_leaves_no_node_behind(
    tmp_path: Path,
) -> None:
    with NatsCluster(tmp_path, nodes=3, shards=1) as cluster:
        assert cluster.jetstream_ready()
        assert len(cluster.url.split(",")) == 3
        pids = [p.pid for p in cluster.processes if p is not None]
        assert len(pids) == 3
    assert cluster.processes == [None, None, None]
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_the_probes_read_a_running_daemons_stored_steps_and_a_processs_memory(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    before = steps_committed(daemon.http_port)
    agent = trainvigil.init(run_id="probed", nats_url=daemon.nats_url, spill_dir=tmp_path, flush_interval=0.05)
    for step in range(25):
        agent.log(step, loss=1.0 / (step + 1))
    assert agent.close(timeout=30)
    wait_until(lambda: steps_committed(daemon.http_port) >= before + 25, 30, "25 more steps stored")
    assert scrape(daemon.http_port)[STEPS_SERIES] == steps_committed(daemon.http_port)
    assert daemon.scalar("select count(*) from steps where run_id = 'probed'") == 25
    peak, now = memory_mib(os.getpid()), memory_mib(os.getpid(), "VmRSS")
    assert 0 < now <= peak
    with pytest.raises(RuntimeError, match="no VmNothing"):
        memory_mib(os.getpid(), "VmNothing")
