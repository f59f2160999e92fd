"""Connecting to the bus: the parsed URL's nodes, a role's credentials and TLS trust, and a bound on the first connect.

Each client has its own policy (:class:`ConnectPolicy`): how long each node's attempt and the whole first connect may
take, whether a connection that was up reconnects for ever, the callbacks that see what nats-py reports. What every
client shares is here: the list of nodes (nats-py reads a comma-separated string as one malformed server), the
credentials of :class:`~.credentials.BusAccess`, a bounded close after a failed connect (after a failed TLS handshake
nats-py's close waits for ever on the lost stream), and the one tell between "nobody answered" and "the bus turned
these credentials away" (:attr:`BusConnectError.refused`).

nats-py is imported at the first connect, not with this module: it takes ~120 ms to import, and ``import trainvigil``
and a disabled agent never pay for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from trainvigil.errors import VigilError

from .credentials import BusAccess, refusal
from .natsurl import NatsUrl

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

__all__ = ["BusConnectError", "ConnectPolicy", "connect"]

ErrorCallback = Callable[[Exception], Awaitable[None]]
Callback = Callable[[], Awaitable[None]]


async def _quiet(exc: Exception) -> None:
    """nats-py prints every failed attempt otherwise; a client says what failed itself, once."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConnectPolicy:
    """How one role connects.

    Attributes:
        name: the connection's name, as the server's monitoring shows it.
        connect_timeout: seconds each node's attempt may take.
        deadline: seconds the whole first connect may take, over every node and try (``None``: no bound; with
            ``reconnect`` nats-py then tries until the connection is up, reporting each failure to ``error_cb``).
        tries_per_node: attempts at each node during the first connect, when ``reconnect`` is off.
        reconnect: keep trying every node (every ``reconnect_wait`` seconds) until ``deadline``, and once connected,
            reconnect for ever instead of closing.
        stop_on_refusal: a refusal during the first connect ends it at once (a wrong password stays wrong);
            off, nats-py keeps trying until ``deadline``.
        error_cb, disconnected_cb, reconnected_cb: what nats-py reports (errors are quiet unless one is given).
        pending_size: bytes nats-py buffers while disconnected (``None``: its default).
    """

    name: str | None = None
    connect_timeout: float = 1.0
    deadline: float | None = 3.0
    tries_per_node: int = 1
    reconnect: bool = False
    stop_on_refusal: bool = True
    reconnect_wait: float = 0.5
    error_cb: ErrorCallback | None = None
    disconnected_cb: Callback | None = None
    reconnected_cb: Callback | None = None
    pending_size: int | None = None


class BusConnectError(VigilError, ConnectionError):
    """The first connect failed: nobody answered at ``url``, or (``refused`` says why) the bus turned this client
    away on purpose (credentials, TLS trust)."""

    def __init__(self, message: str, *, url: NatsUrl, refused: str | None, cause: BaseException) -> None:
        super().__init__(message)
        self.url = url
        self.refused = refused
        self.cause = cause
        """The last failure nats-py saw (a refused TCP connection, a TLS error), or what ended the wait."""


async def connect(url: NatsUrl, access: BusAccess, policy: ConnectPolicy) -> NATS:
    """A connection to one of ``url``'s nodes (nats-py tries them in a random order) as ``access`` says.

    Raises:
        ConfigError: a file of ``access`` cannot be read.
        BusConnectError: no node answered within ``policy.deadline``, or the bus refused these credentials.
    """
    import nats
    import nats.errors

    errors: list[Exception] = []
    stopped = False

    async def keep(exc: Exception) -> None:
        nonlocal stopped
        errors.append(exc)  # a refusal during the first connect reaches only this callback
        await (policy.error_cb or _quiet)(exc)
        if policy.stop_on_refusal and not nc.is_connected and refusal(exc):
            stopped = True
            attempt.cancel()

    options = access.connect_options()
    for option in ("name", "disconnected_cb", "reconnected_cb", "pending_size"):
        if (value := getattr(policy, option)) is not None:
            options[option] = value
    nc = nats.NATS()
    attempt = asyncio.ensure_future(
        nc.connect(
            list(url.servers),
            # nats-py annotates these as int; it takes seconds as float.
            connect_timeout=policy.connect_timeout,  # type: ignore[arg-type]
            reconnect_time_wait=policy.reconnect_wait,  # type: ignore[arg-type]
            allow_reconnect=policy.reconnect,
            max_reconnect_attempts=-1 if policy.reconnect else policy.tries_per_node - 1,
            error_cb=keep,
            **options,
        )
    )
    failure: BaseException
    try:
        await asyncio.wait_for(attempt, policy.deadline)
        return nc
    except asyncio.CancelledError as exc:
        if not stopped:  # the caller was cancelled: so is the attempt (wait_for cancelled it)
            await _close(nc)
            raise
        failure = exc
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        failure = exc
    await _close(nc)
    cause = errors[-1] if errors else failure
    why = refusal(failure) or next((said for seen in errors if (said := refusal(seen))), None)
    if why:
        raise BusConnectError(f"the broker at {url} turned this client away: {why}", url=url, refused=why, cause=cause)
    within = "" if policy.deadline is None else f" within {policy.deadline:g} s"
    raise BusConnectError(
        f"no NATS broker answered at {url}{within} ({type(cause).__name__})", url=url, refused=None, cause=cause
    )


async def _close(nc: NATS) -> None:
    """A failed connection's close, bounded: after a failed TLS handshake nats-py's close waits for ever on the lost
    stream, and a refused connection leaves its socket open otherwise."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 1)
