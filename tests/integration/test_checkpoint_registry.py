"""The checkpoint registry end to end: real training processes save and load through a real broker and daemon;
``vigil checkpoints`` lists them with verification and lineage, and ``vigil verify`` says who saved a file."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import InProcessDaemon
from support import NatsServer, vigil, vigil_together, wait_for

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")

TRAIN = """
import sys, torch, trainvigil
from trainvigil import checkpoint
run_id, action, args = sys.argv[1], sys.argv[2], sys.argv[3:]
with trainvigil.init(run_id=run_id):
    if action == "save":  # PATH STEP, PATH STEP ...: one run saving as it trains
        for path, step in zip(args[::2], args[1::2]):
            checkpoint.save({"w": torch.arange(16.0) * float(step)}, path, step=int(step))
    else:
        try:
            checkpoint.load(args[0])
        except Exception as exc:
            print(type(exc).__name__)
"""


def _train(nats_url: str, *args: str) -> str:
    env = {**os.environ, "VIGIL_NATS_URL": nats_url}
    done = subprocess.run([sys.executable, "-c", TRAIN, *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _flip_last_byte_of_tensor_data(path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename)
    data = bytearray(path.read_bytes())
    start = info.header_offset
    name_len, extra_len = (
        int.from_bytes(data[start + 26 : start + 28], "little"),
        int.from_bytes(data[start + 28 : start + 30], "little"),
    )
    data[start + 30 + name_len + extra_len + 5] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.timeout(90)  # three torch processes and four CLIs: ~29 s
def test_the_registry_shows_saves_loads_failures_lineage_and_who_saved_a_file(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    d = InProcessDaemon(nats_server.url, tmp_path / "data")
    d.start()
    try:
        first, second = tmp_path / "first.pt", tmp_path / "second.pt"
        _train(nats_server.url, "pretrain", "save", str(first), "100", str(second), "200")
        assert _train(nats_server.url, "finetune", "load", str(first)) == ""  # resumed from step 100
        _flip_last_byte_of_tensor_data(second)
        assert _train(nats_server.url, "broken", "load", str(second)) == "CheckpointIntegrityError"
        wait_for(lambda: d.scalar("select count(*) from checkpoints") == 4, 30, "every digest stored")

        where = ["--nats", nats_server.url, "--data-dir", str(d.data_dir)]
        listed, one, checked, corrupt = vigil_together(
            ["checkpoints", *where, "--format", "json"],
            ["checkpoints", "finetune", *where, "--format", "json"],
            ["verify", str(first), *where],
            ["verify", str(second), *where],
        )
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        shown = [(r["run_id"], r["origin"], r["step"], r["verified"], r["lineage"]) for r in rows]
        assert shown == [
            ("pretrain", "save", 100, "1 loads ok, 0 failed", "resumed by finetune"),
            ("pretrain", "save", 200, "0 loads ok, 1 failed", None),
            ("finetune", "load", 100, "ok", "pretrain step 100"),
            ("broken", "load", 200, "FAILED: differs from its manifest", "pretrain step 200"),
        ]
        assert [json.loads(line)["run_id"] for line in one.stdout.splitlines()] == ["finetune"]

        assert checked.returncode == 0, checked.stderr
        assert f"{first}: saved by run pretrain rank 0 at step 100" in checked.stdout
        assert corrupt.returncode == 1 and "MISMATCH" in corrupt.stdout
        assert "saved by run pretrain rank 0 at step 200" in corrupt.stdout  # the manifest's content: who wrote it
    finally:
        d.terminate()


def test_verify_without_a_daemon_or_history_still_gives_its_verdict(tmp_path: Path) -> None:
    import torch

    from trainvigil import checkpoint

    path = tmp_path / "model.pt"
    checkpoint.save({"w": torch.ones(4)}, path, step=3)
    closed = "nats://127.0.0.1:1"  # nothing listens there
    checked = vigil("verify", str(path), "--nats", closed, "--data-dir", str(tmp_path / "none"))
    assert checked.returncode == 0 and "OK" in checked.stdout
    assert "who saved it is unknown" in checked.stderr
