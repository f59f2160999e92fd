"""Live updates for open pages: commit notices fanned out as server-sent events.

The store calls :meth:`Broadcaster.committed` on its writer thread right after each commit (the
daemon's own commit path; nothing polls DuckDB). Commits are fanned out in *ticks*: the first
commit after a quiet spell at once, then at most one tick per :data:`MIN_INTERVAL_S`, to every
page at the same moment, so pages that refetch the same data share one query per tick
(:attr:`Broadcaster.generation` counts ticks; see :mod:`.cache`). Each open page holds a
:class:`Subscription` that collects the runs touched since it last heard, so a slow page gets one
notice naming every run it missed, never a growing queue.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from trainvigil.daemon.batch.decode import IngestBatch

MIN_INTERVAL_S = 0.25
"""At most four ticks a second however fast commits come (each open page refetches on each)."""
KEEPALIVE_S = 15.0


def touched_runs(batch: IngestBatch) -> set[str]:
    """The run ids a committed batch wrote rows for."""
    runs = {part.source.run_id for part in batch.steps}
    for records in (batch.run_starts, batch.run_ends, batch.events, batch.checkpoints):
        runs.update(source.run_id for source, _ in records)
    runs.update(a.run_id for a in batch.anomalies)
    return runs


class Subscription:
    """One open page's pending notice: the runs committed since it last sent one."""

    def __init__(self) -> None:
        self.runs: set[str] = set()
        self.alerts = False
        self.committed_at = 0.0
        self.ready = anyio.Event()

    def take(self) -> dict[str, object]:
        notice = {"runs": sorted(self.runs), "alerts": self.alerts, "committed_at": self.committed_at}
        self.runs, self.alerts, self.ready = set(), False, anyio.Event()
        return notice


class Broadcaster:
    """Fans commit notices out to subscribers; created by the daemon, fed by the store, read by the web."""

    def __init__(self) -> None:
        self._subs: set[Subscription] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.generation = 0
        """Ticks so far: an answer read before the latest tick may be out of date."""
        self._pending: set[str] = set()
        self._pending_alerts = False
        self._committed_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._last_tick = float("-inf")

    def bind(self) -> None:
        """Remember the event loop (call on it) so :meth:`committed` can hand notices over from other threads."""
        self._loop = asyncio.get_running_loop()

    def committed(self, batch: IngestBatch) -> None:
        """The store's ``on_commit`` hook: called on the writer thread; returns at once."""
        if self._loop is None:
            return
        runs, alerts = touched_runs(batch), bool(batch.anomalies)
        # Subscriptions and the generation belong to the loop: the writer thread only schedules the update.
        self._loop.call_soon_threadsafe(self._pend, runs, alerts, time.time())

    def _pend(self, runs: set[str], alerts: bool, at: float) -> None:
        self._pending |= runs
        self._pending_alerts |= alerts
        self._committed_at = at
        if self._timer is None and self._loop is not None and not self.closed:
            delay = max(0.0, self._last_tick + MIN_INTERVAL_S - self._loop.time())
            self._timer = self._loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        self._timer, self._last_tick = None, self._loop.time()
        self.generation += 1
        runs, alerts = self._pending, self._pending_alerts
        self._pending, self._pending_alerts = set(), False
        if not (runs or alerts):
            return
        for sub in self._subs:
            sub.runs |= runs
            sub.alerts |= alerts
            sub.committed_at = self._committed_at
            sub.ready.set()

    def close(self) -> None:
        """The daemon is stopping: every live stream ends."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for sub in self._subs:
            sub.ready.set()

    @property
    def listeners(self) -> int:
        return len(self._subs)

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[Subscription]:
        sub = Subscription()
        self._subs.add(sub)
        try:
            yield sub
        finally:
            self._subs.discard(sub)


async def sse_events(broadcaster: Broadcaster) -> AsyncIterator[str]:
    """The ``text/event-stream`` body of one page: a ``commit`` event per notice, comments as keep-alives."""
    async with broadcaster.subscribe() as sub:
        yield "retry: 1000\n\n"
        while True:
            with anyio.move_on_after(KEEPALIVE_S) as idle:
                await sub.ready.wait()
            if broadcaster.closed:
                return
            if idle.cancelled_caught:
                yield ": keep-alive\n\n"
                continue
            yield f"event: commit\ndata: {json.dumps(sub.take())}\n\n"
