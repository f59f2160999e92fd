"""Bounds on the connections the HTTP side holds: a deadline for each request head, and a cap on their number.

uvicorn waits for ever for a request head (its keep-alive timeout starts only after a first answer)
and accepts connections until the process runs out of file descriptors; then its accept loop fails
with ``EMFILE`` once a second while the health probe waits in the kernel's queue, and the store and
the broker connection cannot open files either. A client that opens connections and sends a few
bytes on each (slow-loris) takes the HTTP side down so. Here:

- a connection waiting for a request head (its first, or the next on a kept-alive connection) is
  closed :data:`HEAD_TIMEOUT_S` after it began waiting, however many bytes trickle in meanwhile;
- at most :func:`connection_cap` connections are open at once, well below the descriptor limit;
  one more arriving at the cap closes the connection that has waited longest for its head, so a
  probe that sends its request at once is answered. Connections with a request running (live
  event streams among them) are never closed for that; when all of them have one, the newcomer is.

uvicorn's ``limit_concurrency`` is not used: it counts half-open connections too and answers ``503``
to every request past it, the health probe's included.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0
"""How long a client may take to send a whole request head."""
KEEP_ALIVE_S = 5
"""How long an idle kept-alive connection stays open after an answer (uvicorn's ``timeout_keep_alive``)."""
MAX_CONNECTIONS = 1000
"""Open connections at most, whatever the descriptor limit."""
MIN_CONNECTIONS = 64


def accept_backlog(cap: int) -> int:
    """The listen queue, which is also how many connections asyncio accepts in one go, before any of them
    is admitted or refused here: a quarter of the cap (64-512), so a burst stays within the descriptors
    the cap leaves free."""
    return max(64, min(512, cap // 4))


def connection_cap(open_files: int | None = None) -> int:
    """Connections the HTTP side holds at most: :data:`MAX_CONNECTIONS`, or half the process's soft
    descriptor limit (``open_files``; default: ``RLIMIT_NOFILE``) if lower; the rest stays for the store,
    the broker and the canaries."""
    if open_files is None:
        open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if open_files == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, open_files // 2))


class ConnectionGuard:
    """The open connections of one server, and those waiting for a request head, longest-waiting first."""

    def __init__(self, cap: int, head_timeout_s: float = HEAD_TIMEOUT_S) -> None:
        self.cap = cap
        self.head_timeout_s = head_timeout_s
        self.open = 0
        self.waiting: dict[GuardedH11, None] = {}  # insertion order: the longest-waiting first
        self.let_go = 0
        """Connections closed for the cap or the head deadline (for tests and the log)."""

    def admit(self) -> bool:
        """Make room for one more connection; ``False`` when every open one has a request running."""
        if self.open < self.cap:
            return True
        if not self.waiting:
            return False
        self.let_go_of(next(iter(self.waiting)))
        return True

    def let_go_of(self, conn: GuardedH11) -> None:
        self.let_go += 1
        self.waiting.pop(conn, None)
        conn.transport.abort()  # the descriptor is freed now, not after a write buffer drains


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol under a :class:`ConnectionGuard` (see :func:`guarded`)."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        room = self.guard.admit()
        super().connection_made(transport)
        self.guard.open += 1
        if not room:
            self.guard.let_go += 1
            transport.abort()
            return
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.open -= 1
        self._head_arrived()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()

    def _watch_head(self) -> None:
        """Wait for a head while h11 waits for one (a new cycle); stop once it came."""
        if self.transport.is_closing():
            self._head_arrived()
        elif self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            if self._head_deadline is None:
                self.guard.waiting[self] = None
                self._head_deadline = self.loop.call_later(self.guard.head_timeout_s, self._head_overdue)
        else:
            self._head_arrived()

    def _head_arrived(self) -> None:
        self.guard.waiting.pop(self, None)
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_overdue(self) -> None:
        self._head_deadline = None
        self.guard.let_go_of(self)


def guarded(guard: ConnectionGuard) -> type[GuardedH11]:
    """The protocol class to hand uvicorn (``Config(http=...)``): every connection it makes counts in ``guard``."""
    return type("GuardedH11", (GuardedH11,), {"guard": guard})
