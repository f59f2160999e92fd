"""`vigil up` without --nats: it starts the bundled nats-server, supervises it, stops it on exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from support import finish, free_port, run_producer, wait_for

from trainvigil.daemon.broker.embedded import port_open


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _nats_child(pid: int) -> int | None:
    for child in _children(pid):
        try:
            if "nats-server" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
                return child
        except OSError:  # it left between the listing and the read (ENOENT, or ESRCH mid-read)
            continue
    return None


def test_embedded_broker_is_started_restarted_and_stopped(tmp_path: Path) -> None:
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    data = tmp_path / "data"
    env = {**os.environ, "VIGIL_EMBEDDED_PORT": str(port), "VIGIL_NATS_URL": ""}
    log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen(
        [sys.executable, "-m", "trainvigil.daemon.cli", "up", "--data-dir", str(data), "--http-port", "0"],
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        first = wait_for(
            lambda: _nats_child(daemon.pid) if port_open("127.0.0.1", port) else None, 30, "the embedded nats-server"
        )
        assert (data / "jetstream").is_dir(), "JetStream storage lives under the data dir"
        wait_for(lambda: b"daemon ready" in (tmp_path / "daemon.log").read_bytes(), 30, "the daemon to be ready")
        os.kill(first, signal.SIGKILL)
        second = wait_for(
            lambda: (c := _nats_child(daemon.pid)) and c != first and port_open("127.0.0.1", port) and c,
            30,
            "a restarted nats-server",
        )
        assert second != first
        finish(run_producer(url, "embedded", 0, 200))
        wait_for(lambda: _count_steps(url, data) == "200", 30, "the daemon to store the steps after the restart")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        assert not port_open("127.0.0.1", port), "the embedded broker stops with the daemon"
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()
    assert _count_steps(url, data) == "200", "the stored steps are there after the daemon stopped"


def _count_steps(url: str, data: Path) -> str:
    """``select count(*) from steps`` through the real CLI (the daemon, else the file)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainvigil.daemon.cli",
            "sql",
            "select count(*) from steps",
            "--data-dir",
            str(data),
            "--nats",
            url,
            "--format",
            "csv",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()[1]


def test_vigil_demo_trains_stores_and_alerts_on_the_corrupt_batch() -> None:
    """`vigil demo`: embedded broker + daemon + real training; every step lands and the fed spike alerts."""
    done = subprocess.run(
        [sys.executable, "-m", "trainvigil.daemon.cli", "demo", "--steps", "150"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "all 150 steps are in DuckDB" in done.stdout
    alerts = done.stdout.split("-- Alerts")[1]
    assert "grad_spike" in alerts and "| 100 " in alerts, alerts
