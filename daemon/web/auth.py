"""Bearer-token access to the HTTP side: every path but ``/healthz`` needs the token when one is set.

``/healthz`` stays open because orchestrators probe it without credentials, and it tells nothing
but up or degraded.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/healthz"})


def carries_token(headers: Iterable[tuple[bytes, bytes]], token: bytes) -> bool:
    """Whether ``headers`` (ASGI's raw pairs) carry ``Authorization: Bearer <token>`` (always true without a token).

    The token is compared in constant time (``hmac.compare_digest``), so how long a refusal takes
    says nothing about how much of a guess was right.
    """
    if not token:
        return True
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, credentials = value.strip().partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token)
    return False


_UNAUTHORIZED = PlainTextResponse(
    "send Authorization: Bearer <the token in http_token_file>\n",
    status_code=401,
    headers={"WWW-Authenticate": 'Bearer realm="trainvigil"'},
)


class BearerAuth:
    """ASGI middleware: 401 with ``WWW-Authenticate: Bearer`` for a request without the token."""

    def __init__(self, app: ASGIApp, token: bytes) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guarded = scope["type"] == "http" and scope["path"] not in OPEN_PATHS
        if guarded and not carries_token(scope["headers"], self.token):
            await _UNAUTHORIZED(scope, receive, send)
            return
        await self.app(scope, receive, send)
