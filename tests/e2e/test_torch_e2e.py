"""watch() and checkpoint integrity through a real nats-server and daemon, into DuckDB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support import HERE, Daemon, NatsServer, wait_for

from trainvigil.daemon.broker.embedded import free_port

SCRIPT = str(HERE / "torch_train.py")


def _run(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, SCRIPT, *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish(proc: subprocess.Popen[bytes]) -> str:
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()[-3000:]
    return err.decode()


def test_watch_and_user_metrics_share_one_row_and_a_corrupt_load_pages(
    daemon: Daemon, nats_server: NatsServer, tmp_path: Path
) -> None:
    err = _finish(_run(["single", "tw", str(tmp_path)], {"VIGIL_NATS_URL": nats_server.url}))
    assert "refused as expected" in err
    wait_for(
        lambda: daemon.scalar("select count(*) from steps where run_id = 'tw' and grad_norm is not null") == 30,
        30,
        "30 watched steps",
    )
    rows = daemon.sql(
        "select step, count(*), any_value(loss), any_value(grad_norm), any_value(lr), any_value(step_time) "
        "from steps where run_id = 'tw' group by step order by step"
    ).rows
    assert [r[0] for r in rows] == list(range(30))
    assert all(r[1] == 1 for r in rows), "one row per step, never two"
    assert all(r[2] is not None and r[3] is not None and r[4] == 0.01 for r in rows), "loss and watch() merged"
    assert rows[0][5] is None and all(r[5] > 0 for r in rows[1:])

    def digests() -> list[list[Any]]:
        return daemon.sql(
            "select origin, ok, step, split_part(path, '/', -1), root from checkpoints "
            "where run_id = 'tw' order by time"
        ).rows

    got = wait_for(lambda: len(digests()) == 3 and digests(), 30, "save, checkpoint_saved and load digests")
    by_file = {(r[0], r[3]): r for r in got}
    assert set(by_file) == {("save", "model.pt"), ("save", "other.pt"), ("load", "model.pt")}
    assert by_file["save", "model.pt"][4] == by_file["save", "other.pt"][4], "same state, same root"
    assert by_file["load", "model.pt"][1] is False and by_file["save", "model.pt"][1] is True
    pages = wait_for(
        lambda: (
            daemon.sql(
                "select rank, severity, message from anomalies where run_id = 'tw' and detector = 'ckpt_mismatch'"
            ).rows
        ),
        30,
        "a ckpt_mismatch page for the corrupt load",
    )
    assert len(pages) == 1 and pages[0][1] == "page"
    assert "model.pt" in pages[0][2] and "0.weight" in pages[0][2], pages[0][2]


def test_ddp_replica_perturbed_at_step_n_pages_once_naming_that_rank(daemon: Daemon, nats_server: NatsServer) -> None:
    perturb, every = 12, 5
    env = {
        "VIGIL_NATS_URL": nats_server.url,
        "VIGIL_RUN_ID": "ddp",
        "VIGIL_FLUSH_INTERVAL": "0.05",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
    }
    procs = [_run(["ddp", "ddp", str(perturb)], {**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
    for p in procs:
        _finish(p)
    wait_for(
        lambda: daemon.scalar("select count(*) from checkpoints where run_id = 'ddp' and origin = 'parity'") == 12,
        30,
        "6 parity digests from each of 2 ranks",
    )
    agree = [
        tuple(r)
        for r in daemon.sql(
            "select step, count(distinct root) from checkpoints where run_id = 'ddp' and origin = 'parity' "
            "group by step order by step"
        ).rows
    ]
    assert agree == [(0, 1), (5, 1), (10, 1), (15, 2), (20, 2), (25, 2)], "replicas agree until the perturbation"
    pages = wait_for(
        lambda: (
            daemon.sql(
                "select rank, step, severity, message from anomalies "
                "where run_id = 'ddp' and detector = 'ckpt_mismatch'"
            ).rows
        ),
        30,
        "the ckpt_mismatch page",
    )
    assert len(pages) == 1, pages
    rank, step, severity, message = pages[0]
    assert (rank, severity) == (1, "page")
    assert perturb <= step <= perturb + every, step
    assert "rank 1" in message and "0.weight" in message
    assert daemon.scalar("select count(*) from steps where run_id = 'ddp' and grad_norm is not null") == 60
