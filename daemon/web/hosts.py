"""Which ``Host`` names the HTTP side answers: its own addresses and names, and those allowed (DNS rebinding).

A page on another site can point its own name at ``127.0.0.1`` (or at a daemon on the office network)
once the browser has loaded it; its scripts then read the daemon's answers as same-origin. What gives
such a request away is its ``Host`` header: the attacker's name, not one of the daemon's. So a request
is answered only when its ``Host`` is

- an address literal the daemon can be reached at: a loopback address when it listens on loopback,
  the address it listens on, any address when it listens on every interface (no DNS answer can put
  another site's page behind an address written in the URL);
- ``localhost``, or the machine's own name when it listens beyond loopback;
- a name in ``http_allowed_hosts`` (``name``, or ``.example.com`` for it and every subdomain; ``*``: any).

The port is not compared: the page of a rebinding attack names the very port the browser connects to,
so it tells nothing, and a daemon behind a port mapping is reached on another one.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from trainvigil.daemon.broker.bus import is_loopback

WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def host_name(header: str) -> str:
    """The name or address in a ``Host`` header, lower-case, without port, brackets or a trailing dot."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:9464
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        header = header.partition(":")[0]
    return header.rstrip(".")


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


class HostPolicy:
    """Whether a ``Host`` names the daemon listening on ``bind_host``, or one of ``allowed``.

    Args:
        bind_host: ``http_host``: the address (or name) the HTTP side listens on.
        allowed: ``http_allowed_hosts``: more names it answers to.
    """

    def __init__(self, bind_host: str, allowed: Iterable[str] = ()) -> None:
        bind = host_name(bind_host)
        self._loopback = is_loopback(bind)
        self._everywhere = bind in WILDCARDS
        self._bound = _address(bind)
        names = {bind, "localhost"}
        if not self._loopback:
            names.add(host_name(socket.gethostname()))  # not getfqdn(): a reverse lookup may hang the start
        self._suffixes: list[str] = []
        self._any = False
        for entry in allowed:
            entry = entry.strip().lower()
            if entry == "*":
                self._any = True
            elif entry.startswith("."):
                self._suffixes.append(entry.rstrip("."))
            elif entry:
                names.add(host_name(entry))
        self._names = frozenset(names - {""})

    def allows(self, header: str) -> bool:
        """Whether a request whose ``Host`` header is ``header`` is answered."""
        name = host_name(header)
        if self._any or name in self._names:
            return True
        if any(name == suffix[1:] or name.endswith(suffix) for suffix in self._suffixes):
            return True
        address = _address(name)
        if address is None:
            return False
        if self._everywhere:
            return True
        return address.is_loopback if self._loopback else address == self._bound


def _refusal(name: str) -> PlainTextResponse:
    shown = name[:80] + ("..." if len(name) > 80 else "")
    return PlainTextResponse(
        f"this daemon does not answer to the host {shown!r}; add it to http_allowed_hosts "
        "(VIGIL_HTTP_ALLOWED_HOSTS) if it is one of its names\n",
        status_code=421,
    )


class HostCheck:
    """ASGI middleware: ``421 Misdirected Request`` for a request whose ``Host`` the policy refuses.

    Every path is checked, ``/healthz`` and ``/metrics`` too: Prometheus and orchestrators send the
    target's own name, which is the daemon's. A request without ``Host`` (HTTP/1.0) is answered: a
    browser always sends one.
    """

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"host":
                    header = value.decode("latin-1")
                    if not self.policy.allows(header):
                        await _refusal(host_name(header))(scope, receive, send)
                        return
                    break
        await self.app(scope, receive, send)
