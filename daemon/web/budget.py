"""The web view's share of the machine while the ingest needs all of it.

The HTTP side runs on the daemon's event loop, under its GIL, and its queries on the cores the
ingest needs. Left alone, many clients asking as fast as they can (200 connections, each sending its
next request as soon as the last is answered) take whatever CPU there is, and ingest slows in
proportion. While the ingest is heavy (:meth:`.live.Broadcaster.busy`) *and* the cores are saturated
(:class:`CpuSaturated`),
:class:`HttpBudget` holds the HTTP side to :data:`SHARE` of one core. Each request is charged the
loop thread's CPU time while it ran (less what it spent waiting), the time of the query it ran in
DuckDB's threads, and a fixed cost for the HTTP protocol around it; once the budget is spent, the
next requests wait, in arrival order, for it to refill. Nothing is refused. With a core to spare, or
no ingest, there is no limit: a page opens and refreshes as fast as the daemon can answer it.

``/healthz`` and ``/metrics`` are never held (orchestrators and Prometheus time out on them), nor the
live event streams (they cost nothing between notices).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

SHARE = 0.2
"""The most of one core the HTTP side may use while the ingest is heavy and the cores saturated: enough
for ten live pages at the strained tick rate (:data:`.live.STRAINED_INTERVAL_S`), and a tenth of a
2-core machine."""
BURST_S = 0.05
"""CPU seconds a quiet HTTP side saves up: a page's first dozen requests are never held."""
PER_REQUEST_S = 0.0001
"""Charged to every request besides its own time: uvicorn's parsing and writing around the app (about
0.1 to 0.2 ms a request on a 2-core machine, measured with bench/web.py's load)."""
MAX_CHARGE_S = BURST_S
"""The most one request is charged: a cold query over a long run (half a second) holds the next requests
for ``MAX_CHARGE_S / SHARE``, not for ten times its length."""
IDLE_BELOW = 0.1
"""The cores count as saturated while less than this fraction of their time was idle."""
EXEMPT = frozenset({"/healthz", "/metrics", "/api/live"})


class _Account:
    """What the request running now has cost beyond its own time on the loop, and what it waited."""

    def __init__(self) -> None:
        self.waited = 0.0
        self.extra = 0.0


_account: ContextVar[_Account | None] = ContextVar("vigil_http_account", default=None)


@asynccontextmanager
async def off_the_clock() -> AsyncIterator[None]:
    """Wrap a wait (a query in a worker thread, another request's answer): the thread's CPU time meanwhile
    is other tasks' work (the ingest's among them), so the request waiting is not charged for it."""
    started = time.thread_time()
    try:
        yield
    finally:
        account = _account.get()
        if account is not None:
            account.waited += time.thread_time() - started


def charge(seconds: float) -> None:
    """Charge the request running now for work done off the loop: a query's time in DuckDB's threads,
    which take cores from the ingest as much as the loop does."""
    account = _account.get()
    if account is not None:
        account.extra += seconds


class CpuSaturated:
    """Whether the machine's cores were (nearly) all busy of late, from ``/proc/stat`` (Linux; elsewhere
    always true, and the budget then holds whenever commits flow).

    The budget only bites while the cores are saturated: with a core to spare, a page's queries take
    nothing from the ingest, and live pages refresh at full speed.
    """

    def __init__(self, idle_below: float = IDLE_BELOW, every_s: float = 0.25) -> None:
        self._idle_below = idle_below
        self._every = every_s
        self._last = _cpu_times()
        self._at = time.monotonic()
        self._saturated = self._last is None

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._at >= self._every:
            times = _cpu_times()
            if times is not None and self._last is not None:
                idle, total = times[0] - self._last[0], times[1] - self._last[1]
                self._saturated = total > 0 and idle / total < self._idle_below
            self._last, self._at = times, now
        return self._saturated


def _cpu_times() -> tuple[int, int] | None:
    """The machine's (idle, total) CPU ticks since boot, or ``None`` without ``/proc/stat``."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return fields[3] + fields[4], sum(fields)  # idle + iowait; guest time is already in user


class HttpBudget:
    """ASGI middleware: while ``busy()``, requests use at most ``share`` of the loop's thread.

    Args:
        busy: whether the ingest is committing now (:attr:`.live.Broadcaster.busy`).
        share: the fraction of one core the HTTP side may use meanwhile.
        burst_s: CPU seconds saved up while the HTTP side was quiet.
    """

    def __init__(self, app: ASGIApp, busy: Callable[[], bool], share: float = SHARE, burst_s: float = BURST_S) -> None:
        self.app = app
        self._busy = busy
        self._share = share
        self._burst = burst_s
        self._tokens = burst_s
        self._stamp = time.monotonic()
        self._turn: anyio.Lock | None = None  # made on the loop, at the first request
        self.held = 0
        """Requests that waited for the budget (for tests and the bench)."""

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._share)
        self._stamp = now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT:
            await self.app(scope, receive, send)
            return
        if self._busy():
            if self._turn is None:
                self._turn = anyio.Lock()
            async with self._turn:  # a fair lock: waiting requests are let through in arrival order
                self._refill()
                if self._tokens < 0:
                    self.held += 1
                while self._tokens < 0:
                    await anyio.sleep(-self._tokens / self._share)
                    self._refill()
        else:
            self._refill()
        account = _Account()
        token = _account.set(account)
        started = time.thread_time()
        try:
            await self.app(scope, receive, send)
        finally:
            own = max(0.0, time.thread_time() - started - account.waited)
            self._tokens -= min(MAX_CHARGE_S, PER_REQUEST_S + own + account.extra)
            _account.reset(token)
