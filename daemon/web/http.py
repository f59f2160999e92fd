"""The daemon's HTTP side: the Starlette app (:mod:`.routes`) served by uvicorn inside the daemon's task group.

With ``http_token_file`` set, every request but ``/healthz`` (which orchestrators probe without
credentials, and which tells nothing but up or degraded) must carry ``Authorization: Bearer <token>``,
else it gets 401 and ``WWW-Authenticate: Bearer``. Without one, a daemon listening beyond loopback
says at start that anyone who reaches its port reads every run. Only the ``Host`` names of
:mod:`.hosts` are answered, and :mod:`.connections` bounds what slow clients may hold.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Sequence

import anyio
import structlog
import uvicorn
from anyio.abc import TaskStatus

from trainvigil.daemon.broker.bus import is_loopback
from trainvigil.daemon.config import read_secret
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.daemon.web.connections import (
    KEEP_ALIVE_S,
    ConnectionGuard,
    accept_backlog,
    connection_cap,
    guarded,
)
from trainvigil.daemon.web.data import DataApi
from trainvigil.daemon.web.hosts import HostPolicy, host_name
from trainvigil.daemon.web.live import Broadcaster
from trainvigil.daemon.web.routes import build_app

log = structlog.get_logger("trainvigil.http")
_SHUTDOWN_S = 2


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the daemon owns SIGTERM/SIGINT and stops the task group."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket, bound before anything else starts, so a taken port fails the start-up."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets that say so, and without it a
    # keep-alive client waits ~40 ms (delayed ACK) for every response written in two parts.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_http(
    host: str,
    port: int,
    metrics: DaemonMetrics,
    token_file: str = "",
    *,
    allowed_hosts: Sequence[str] = (),
    api: DataApi | None = None,
    live: Broadcaster | None = None,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; reports the bound port (port 0 means 'off' in the config, so tests pass a free one).

    Args:
        token_file: ``http_token_file``: the bearer token every request but ``/healthz`` needs ("" = none).
        allowed_hosts: ``http_allowed_hosts``: ``Host`` names answered besides the daemon's own (:mod:`.hosts`).
        api, live: the web view's data and live updates (without them, only ``/healthz`` and ``/metrics``).

    Raises:
        ConfigError: ``token_file`` cannot be read or holds no valid token (before anything listens).
        OSError: the address cannot be bound.
    """
    token = read_secret("http_token_file", token_file).encode() if token_file else b""
    guard = ConnectionGuard(connection_cap())
    backlog = accept_backlog(guard.cap)
    sock = _listen(host, port, backlog)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        build_app(metrics, token, api, live, hosts=HostPolicy(host, allowed_hosts)),
        log_config=None,
        access_log=False,
        lifespan="off",
        http=guarded(guard),
        ws="none",
        backlog=backlog,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=_SHUTDOWN_S,
    )
    server = _Server(config)
    endpoints = ["/healthz", "/metrics"] + (["/"] if api is not None else [])
    log.info(
        "http_listening",
        url=f"http://{host}:{bound}",
        endpoints=endpoints,
        token=bool(token),
        max_connections=guard.cap,
    )
    if not token and not is_loopback(host_name(host)):
        log.warning(
            "http_without_token",
            host=host,
            port=bound,
            note=f"anyone who can reach port {bound} reads every run, alert and metric; set a token: write one "
            "to a file (mode 0600) and point http_token_file (VIGIL_HTTP_TOKEN_FILE) at it",
        )
    if live is not None:
        live.bind()
    task_status.started(bound)
    try:
        await server.serve(sockets=[sock])
    finally:
        # Cancelled with the daemon: stop accepting and drop open connections (live pages never end).
        with anyio.CancelScope(shield=True), anyio.move_on_after(_SHUTDOWN_S):
            server.should_exit = server.force_exit = True
            if live is not None:
                live.close()
            await server.shutdown(sockets=[sock])
        sock.close()
