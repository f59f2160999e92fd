"""The bundled nats-server lives as long as its `vigil up`: killed or hung up, the daemon takes it along,
and a bundled broker left running from before is named and replaced by the next `vigil up`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import finish, free_port, gone, run_producer, wait_for
from test_embedded import _nats_child

from trainvigil.daemon.broker import embedded
from trainvigil.daemon.broker.embedded import port_open

VIGIL = [sys.executable, "-m", "trainvigil.daemon.cli"]


class Bundled:
    """`vigil up` with its bundled broker on a free port, as a real process; its log in ``log``."""

    def __init__(self, tmp_path: Path, port: int | None = None, name: str = "data") -> None:
        self.port = port or free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.data = tmp_path / name
        self.log = tmp_path / f"{name}.log"
        env = {**os.environ, "VIGIL_EMBEDDED_PORT": str(self.port), "VIGIL_NATS_URL": ""}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [*VIGIL, "up", "--data-dir", str(self.data), "--http-port", "0"],
                env=env,
                stdout=log,
                stderr=log,
            )

    def ready(self) -> int:
        """Wait until the daemon is ready; the pid of its nats-server."""
        wait_for(lambda: b"daemon ready" in self.log.read_bytes() or self.process.poll() is not None, 60, "ready")
        assert self.process.poll() is None, self.log.read_text()[-2000:]
        child = wait_for(lambda: _nats_child(self.process.pid), 30, "the bundled nats-server")
        assert isinstance(child, int)
        return child


@contextlib.contextmanager
def _cleanup(*pids: list[int]) -> Iterator[None]:
    """SIGKILL whatever of ``pids`` (lists filled in by the test) is still alive at the end."""
    try:
        yield
    finally:
        for pid in (p for group in pids for p in group):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_the_bundled_broker_dies_with_its_daemon(tmp_path: Path, signum: signal.Signals) -> None:
    pids: list[int] = []
    with _cleanup(pids):
        up = Bundled(tmp_path)
        pids.append(up.process.pid)
        pids.append(up.ready())
        up.process.send_signal(signum)
        code = up.process.wait(30)
        wait_for(lambda: gone(pids[1]), 30, "the bundled nats-server to stop with its daemon")
        assert not port_open("127.0.0.1", up.port)
        if signum == signal.SIGHUP:  # drained and stopped, as on SIGTERM
            assert code == 0, up.log.read_text()[-2000:]
            assert '"signal": "SIGHUP"' in up.log.read_text()
            assert b'"stopped"' in up.log.read_bytes()


def test_a_stray_bundled_broker_is_named_and_replaced(tmp_path: Path) -> None:
    """A bundled nats-server whose `vigil up` is gone (left running on purpose here, as a daemon without
    the parent-death signal left it) is named in one line, stopped, and the daemon starts its own."""
    port = free_port()
    data = tmp_path / "data"
    data.mkdir()
    stray = subprocess.Popen(
        embedded.server_args(embedded.find_binary(), port, data / "jetstream", **embedded.marks(data)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pids = [stray.pid]
    with _cleanup(pids):
        wait_for(lambda: port_open("127.0.0.1", port), 10, "the stray nats-server")
        up = Bundled(tmp_path, port)
        pids.append(up.process.pid)
        own = up.ready()
        pids.append(own)
        assert own != stray.pid
        assert stray.wait(30) == 0, "the stray was stopped cleanly"
        said = [line for line in up.log.read_text().splitlines() if re.search(rf"\b{stray.pid}\b", line)]
        assert len(said) == 1 and "left" in said[0] and "running" in said[0], up.log.read_text()[-2000:]
        finish(run_producer(up.url, "after-stray", 0, 20))
        wait_for(lambda: b"after-stray" in _sql(up.url, data), 30, "the daemon to store the steps")
        up.process.send_signal(signal.SIGTERM)
        assert up.process.wait(30) == 0


def _sql(url: str, data: Path) -> bytes:
    out = subprocess.run(
        [*VIGIL, "sql", "select run_id from runs", "--nats", url, "--data-dir", str(data), "--format", "csv"],
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_second_vigil_up_on_the_bundled_broker_of_another_names_that_daemon(tmp_path: Path) -> None:
    """Two `vigil up` in two directories: the second finds the first's bundled broker and refuses, naming
    the first's data dir; the first keeps its broker."""
    pids: list[int] = []
    with _cleanup(pids):
        first = Bundled(tmp_path, name="first")
        pids.append(first.process.pid)
        broker = first.ready()
        pids.append(broker)
        second = Bundled(tmp_path, first.port, name="second")
        pids.append(second.process.pid)
        assert second.process.wait(60) == 2, second.log.read_text()[-2000:]
        said = [line for line in second.log.read_text().splitlines() if line.startswith("vigil: ")]
        assert len(said) == 1 and str(first.data.resolve()) in said[0], said
        assert not gone(broker) and first.process.poll() is None
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(30) == 0
