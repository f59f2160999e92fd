"""The worker's edge to the broker: a small protocol, and its NATS JetStream implementation.

The worker only needs to know whether the broker is there and to publish a round of messages,
learning how many from the front were acknowledged; tests drive it with a hand-written fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trainvigil.schemas.credentials import refusal
from trainvigil.schemas.natsconnect import BusConnectError, ConnectPolicy, connect
from trainvigil.schemas.natsurl import parse_nats_url
from trainvigil.schemas.redact import redact_url
from trainvigil.schemas.settings import quiet_backoff

from ..options import AgentOptions
from ..spill.outbox import OutMsg
from ..spill.push import FileResult, upload
from .acks import AckInbox, publish_round

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

log = logging.getLogger("trainvigil.agent")

RECONNECT_WAIT_S = 1.0
"""How often nats-py tries a broker that is away again (the first connect too). Each try wakes the agent's
thread several times: at 0.25 s an agent without a broker spent 3x the CPU of one with it at 10 steps/s
(bench/README.md, `agent_thread_cpu.py --offline`). A second is the flush interval's own delay."""


class Publisher(Protocol):
    """Where the worker's messages go."""

    @property
    def connected(self) -> bool:
        """The broker is there now."""
        ...

    @property
    def ever_connected(self) -> bool:
        """The broker was there at some point."""
        ...

    @property
    def unreachable(self) -> bool:
        """No broker answered yet and the first attempt failed (``close()`` does not wait for one)."""
        ...

    async def run(self, changed: Callable[[], None]) -> None:
        """Connect, and keep the connection until cancelled; call ``changed()`` whenever
        :attr:`connected` or :attr:`unreachable` changes."""
        ...

    async def publish(self, msgs: Sequence[OutMsg], timeout: float) -> tuple[int, BaseException | None]:
        """Publish ``msgs`` in order; how many from the front were acknowledged, and the first error."""
        ...

    async def deliver_file(self, path: Path, only_for: str) -> FileResult:
        """Deliver the sealed spill file at ``path`` if it is meant for broker ``only_for``
        (see :mod:`trainvigil.agents.spill.push`)."""
        ...


class NatsPublisher:
    """JetStream through nats-py; nats-py reconnects a lost connection, the retry policy covers the first."""

    def __init__(
        self, options: AgentOptions, name: str, pace: Callable[[], None], noticed: Callable[[str], None]
    ) -> None:
        self.options = options
        self.name = name
        self._pace = pace
        self._noticed = noticed
        self._inbox: AckInbox | None = None
        self._connected = False
        self._ever_connected = False
        self._failed_once = False
        self._refused_once = False

    @property
    def connected(self) -> bool:
        return self._connected and self._inbox is not None

    @property
    def ever_connected(self) -> bool:
        return self._ever_connected

    @property
    def unreachable(self) -> bool:
        return self._failed_once and not self._ever_connected

    async def run(self, changed: Callable[[], None]) -> None:
        def set_connected(value: bool) -> None:
            self._connected = value
            changed()

        async def on_disconnect() -> None:
            set_connected(False)

        async def on_reconnect() -> None:
            set_connected(True)

        async def on_error(exc: Exception) -> None:
            self._noticed(repr(exc))
            if not self._ever_connected:  # nats-py retries the first connect itself, reporting each failure here
                self._first_failure(exc)
                changed()
            elif refusal(exc):  # refused later: a permission (publishing with a reader's file), a rotated password
                self._say_refused(exc)

        opts = self.options
        # No deadline: nats-py tries the nodes until one answers, reporting each failure to on_error; a refusal
        # does not end it either (the agent keeps its data and keeps trying, whatever the broker says).
        policy = ConnectPolicy(
            name=self.name,
            connect_timeout=1,
            deadline=None,
            reconnect=True,
            reconnect_wait=RECONNECT_WAIT_S,
            stop_on_refusal=False,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            pending_size=16 * 2**20,
        )
        waits = quiet_backoff(opts.retry_wait_initial, opts.retry_wait_max)  # silent: see its docstring
        while True:
            try:
                nc: NATS = await connect(parse_nats_url(opts.nats_url), opts.access, policy)
                break
            except Exception as exc:
                cause = exc.cause if isinstance(exc, BusConnectError) else exc
                self._noticed(repr(cause))
                self._first_failure(cause)
                changed()
            await asyncio.sleep(next(waits))
        try:
            self._inbox = await AckInbox(nc).open()
            self._ever_connected = True
            set_connected(True)
            await asyncio.Future()  # hold the connection until cancelled
        finally:
            inbox, self._inbox = self._inbox, None
            if inbox is not None:
                await inbox.close()  # a round waiting for acks ends now, its messages kept for the next connection
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), timeout=1.0)

    async def publish(self, msgs: Sequence[OutMsg], timeout: float) -> tuple[int, BaseException | None]:
        if self._inbox is None:
            return 0, ConnectionError("not connected")
        return await publish_round(self._inbox, msgs, timeout, self._pace)

    async def deliver_file(self, path: Path, only_for: str) -> FileResult:
        if self._inbox is None:
            return FileResult(path, error="not connected")
        opts = self.options
        return await upload(
            self._inbox,
            path,
            max_inflight=opts.max_inflight,
            ack_timeout=opts.ack_timeout,
            only_for=only_for,
            subjects=opts.subjects,
        )

    def _first_failure(self, exc: BaseException) -> None:
        """Say once, at the first failed connect, that data is kept and where."""
        if self._failed_once:
            return
        self._failed_once = True
        if refusal(exc):
            self._say_refused(exc)
            return
        where = self.options.spill_dir
        log.warning(
            "trainvigil: no broker answers at %s (%s: %s); metrics are kept locally (under %s) and "
            "sent once it answers; what is left at exit stays in %s for the next run or `vigil push`",
            redact_url(self.options.nats_url),
            type(exc).__name__,
            exc,
            where,
            where,
        )

    def _say_refused(self, exc: BaseException) -> None:
        """Say once, in one line, that the broker turned this agent away on purpose, and that data is kept."""
        if self._refused_once:
            return
        self._refused_once = True
        opts = self.options
        log.warning(
            "trainvigil: the broker at %s turned this agent away: %s (VIGIL_NATS_CREDS=%s); metrics are kept "
            "locally (under %s) and sent once it accepts them; what is left at exit stays there "
            "for `vigil push`",
            redact_url(opts.nats_url),
            refusal(exc),
            opts.nats_creds or "not set",
            opts.spill_dir,
        )
