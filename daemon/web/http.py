"""``GET /healthz`` and ``GET /metrics``: a minimal HTTP/1.1 server on anyio, nothing else.

With ``http_token_file`` set, every request but ``/healthz`` (which orchestrators probe without
credentials, and which tells nothing but up or degraded) must carry ``Authorization: Bearer <token>``,
else it gets 401 and ``WWW-Authenticate: Bearer``.
"""

from __future__ import annotations

import contextlib
import hmac
import json

import anyio
import structlog
from anyio.abc import SocketStream, TaskStatus

from trainvigil.daemon.config import read_secret
from trainvigil.daemon.metrics import DaemonMetrics

log = structlog.get_logger("trainvigil.http")


def _response(status: str, body: bytes, content_type: str, extra: str = "") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{extra}"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


_UNAUTHORIZED = _response(
    "401 Unauthorized",
    b"send Authorization: Bearer <the token in http_token_file>\n",
    "text/plain",
    'WWW-Authenticate: Bearer realm="trainvigil"\r\n',
)


def carries_token(head: bytes, token: bytes) -> bool:
    """Whether a request's head carries ``Authorization: Bearer <token>`` (always true without a token).

    The token is compared in constant time (``hmac.compare_digest``), so how long a refusal takes
    says nothing about how much of a guess was right.
    """
    if not token:
        return True
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"authorization":
            scheme, _, credentials = value.strip().partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token)
    return False


def respond(request_line: str, metrics: DaemonMetrics, *, authorized: bool = True) -> bytes:
    """The whole HTTP response for one request line (pure, so it is tested without sockets).

    A HEAD request gets the GET response's head only (Content-Length still tells its size).
    ``authorized``: whether the request carried the token (see :func:`carries_token`); ``/healthz``
    answers either way.
    """
    parts = request_line.split()
    if len(parts) < 2 or parts[0] not in {"GET", "HEAD"}:
        return _response("405 Method Not Allowed", b"only GET\n", "text/plain")
    path = parts[1].split("?", 1)[0]
    response = _get(path, metrics) if authorized or path == "/healthz" else _UNAUTHORIZED
    if parts[0] == "HEAD":
        return response[: response.index(b"\r\n\r\n") + 4]
    return response


def _get(path: str, metrics: DaemonMetrics) -> bytes:
    if path == "/metrics":
        return _response("200 OK", metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")
    if path == "/healthz":
        broker = "" if metrics.broker_connected else "broker_disconnected"
        reasons = [r for r in (broker, metrics.stuck, metrics.store_unavailable) if r]
        health: dict[str, object] = {
            "status": "degraded" if reasons else "ok",
            "broker_connected": metrics.broker_connected,
            "last_seq": metrics.last_seq,
            "consumer_lag": metrics.consumer_lag,
        }
        if reasons:
            health["reasons"] = reasons
        body = json.dumps(health).encode()
        return _response("503 Service Unavailable" if reasons else "200 OK", body, "application/json")
    return _response("404 Not Found", b"try /healthz or /metrics\n", "text/plain")


async def _handle(stream: SocketStream, metrics: DaemonMetrics, token: bytes) -> None:
    async with stream:
        data = b""
        with anyio.move_on_after(5):
            while b"\r\n\r\n" not in data and len(data) < 8192:
                try:
                    chunk = await stream.receive(4096)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                data += chunk
        head = data.split(b"\r\n\r\n", 1)[0]
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stream.send(respond(line, metrics, authorized=carries_token(head, token)))


async def serve_http(
    host: str,
    port: int,
    metrics: DaemonMetrics,
    token_file: str = "",
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; reports the bound port (useful with port 0... which means 'off'
    in the config, so tests pass an explicit free port).

    Args:
        token_file: ``http_token_file``: the bearer token every request but ``/healthz`` needs ("" = none).

    Raises:
        ConfigError: ``token_file`` cannot be read or holds no valid token (before anything listens).
    """
    token = read_secret("http_token_file", token_file).encode() if token_file else b""
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)
    log.info("http_listening", url=f"http://{host}:{bound}", endpoints=["/healthz", "/metrics"], token=bool(token))
    task_status.started(bound)
    async with listener:
        await listener.serve(lambda s: _handle(s, metrics, token))
