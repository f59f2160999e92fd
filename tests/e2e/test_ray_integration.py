"""Ray Train: inside a worker the agent takes rank, world size and run id from ``ray.train.get_context()``, with
no arguments, so one run groups every worker. A real local Ray instance, a ``TorchTrainer`` of 2 CPU workers,
a real broker and daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import Daemon, NatsServer, wait_for


@pytest.fixture(autouse=True)
def _ray_train_torch() -> None:
    """Skips this module's tests without Ray Train's torch support; imported here, not at the top, because
    it takes seconds and every test process collects every module."""
    pytest.importorskip("ray.train.torch")


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "integrations" / "ray_train.py"
"""The docs' Ray Train example, a whole script."""


@pytest.mark.timeout(300)  # a local Ray instance and two torch workers: ~33 s alone, over 100 s beside other tests
def test_ray_train_workers_log_as_the_ranks_of_one_run_with_no_arguments(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    d = Daemon(nats_server.url, tmp_path / "data")
    d.start()
    try:
        env = {**os.environ, "VIGIL_NATS_URL": nats_server.url, "PYTHONWARNINGS": "ignore", "RAY_AUTH_MODE": "disabled"}
        argv = [sys.executable, str(EXAMPLE), str(tmp_path / "ray"), "--workers", "2", "--steps", "50"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        wait_for(lambda: d.scalar("select count(*) from runs where status = 'ok'") == 1, 30, "the run ended")
        assert d.sql("select run_id, world_size from runs").rows == [["ray-regression", 2]]
        per_rank = d.sql("select rank, count(loss), count(step_time) from steps group by rank order by rank").rows
        assert per_rank == [[0, 50, 50], [1, 50, 50]]
        assert d.scalar("select max(loss) < 1e6 and min(step_time) > 0 from steps")
    finally:
        d.terminate()


def test_outside_a_ray_train_worker_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray.train  # noqa: F401  (imported, as a Ray driver has it: get_context() raises there)

    from trainvigil.agents.options import ray_worker, resolve

    assert ray_worker() is None
    options, _ = resolve(None, None, None, {}, env={"RANK": "3", "WORLD_SIZE": "4", "VIGIL_RUN_ID": "r"})
    assert (options.rank, options.world_size, options.run_id) == (3, 4, "r")
