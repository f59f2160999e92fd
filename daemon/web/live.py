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
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

from trainvigil.daemon.batch.decode import IngestBatch

MIN_INTERVAL_S = 0.25
"""At most four ticks a second however fast commits come (each open page refetches on each)."""
STRAINED_INTERVAL_S = 0.75
"""The interval while the machine is strained (:meth:`Broadcaster.strain_when`): every open page's
refetch, and the browser's redraw, three times rarer, and a step still on screen within a second."""
BUSY_S = 1.0
"""The window over which the committed step rate is measured (see :meth:`Broadcaster.busy`)."""
HEAVY_STEPS_S = 20_000
"""Committed steps a second from which the ingest counts as working hard: a fleet of 2 000 ranks at 10
steps/s. Below it the web view is never held back (see :mod:`.budget`)."""
KEEPALIVE_S = 15.0
NOTICE_RUNS_MAX = 1000
"""Runs a notice names at most: past them it says "every run" (``runs: null``, which pages read as a
refetch of what they show), so a slow page behind a flood of runs holds no set of every run id it missed."""


def merged(into: set[str] | None, runs: set[str] | None) -> set[str] | None:
    """``into`` with ``runs`` added in place; None (every run) once that would name over :data:`NOTICE_RUNS_MAX`."""
    if into is None or runs is None:
        return None
    into |= runs
    return None if len(into) > NOTICE_RUNS_MAX else into


def touched_runs(batch: IngestBatch) -> set[str]:
    """The run ids a committed batch wrote rows for."""
    runs = {part.source.run_id for part in batch.steps}
    for records in (batch.run_starts, batch.run_ends, batch.events, batch.checkpoints):
        runs.update(source.run_id for source, _ in records)
    runs.update(a.run_id for a in batch.anomalies)
    return runs


def has_events(batch: IngestBatch) -> bool:
    """Whether a committed batch holds more than steps and alerts: events, checkpoints, run starts or ends.

    Pages redraw their markers and re-read a run's status only then, not on every step.
    """
    return bool(batch.events or batch.checkpoints or batch.run_starts or batch.run_ends)


class Subscription:
    """One open page's pending notice: the runs committed since it last sent one, and what else came."""

    def __init__(self) -> None:
        self.runs: set[str] | None = set()
        """The runs committed since the last notice; None: more than :data:`NOTICE_RUNS_MAX`, every run."""
        self.alerts = False
        self.events = False
        self.committed_at = 0.0
        self.ready = anyio.Event()

    def take(self) -> dict[str, object]:
        notice: dict[str, object] = {
            "runs": None if self.runs is None else sorted(self.runs),
            "alerts": self.alerts,
            "events": self.events,
            "committed_at": self.committed_at,
        }
        self.runs, self.alerts, self.events, self.ready = set(), False, False, anyio.Event()
        return notice


class Broadcaster:
    """Fans commit notices out to subscribers; created by the daemon, fed by the store, read by the web."""

    def __init__(self) -> None:
        self._subs: set[Subscription] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.generation = 0
        """Ticks so far: an answer read before the latest tick may be out of date."""
        self._pending: set[str] | None = set()
        self._pending_alerts = False
        self._pending_events = False
        self._committed_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._last_tick = float("-inf")
        self._recent: deque[tuple[float, int]] = deque()  # (monotonic time, steps) of commits within BUSY_S
        self._recent_steps = 0
        self._strained: Callable[[], bool] = lambda: False

    def bind(self) -> None:
        """Remember the event loop (call on it) so :meth:`committed` can hand notices over from other threads."""
        self._loop = asyncio.get_running_loop()

    def committed(self, batch: IngestBatch) -> None:
        """The store's ``on_commit`` hook: called on the writer thread; returns at once."""
        if self._loop is None:
            return
        runs, alerts, events = touched_runs(batch), bool(batch.anomalies), has_events(batch)
        steps = sum(len(part) for part in batch.steps)
        # Subscriptions and the generation belong to the loop: the writer thread only schedules the update.
        self._loop.call_soon_threadsafe(self._pend, runs, alerts, events, steps, time.time())

    def _pend(self, runs: set[str], alerts: bool, events: bool, steps: int, at: float) -> None:
        self._pending = merged(self._pending, runs)
        self._pending_alerts |= alerts
        self._pending_events |= events
        self._committed_at = at
        self._recent.append((time.monotonic(), steps))
        self._recent_steps += steps
        self._forget_old()
        if self._timer is None and self._loop is not None and not self.closed:
            interval = STRAINED_INTERVAL_S if self._strained() else MIN_INTERVAL_S
            delay = max(0.0, self._last_tick + interval - self._loop.time())
            self._timer = self._loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        self._timer, self._last_tick = None, self._loop.time()
        self.generation += 1
        runs, alerts, events = self._pending, self._pending_alerts, self._pending_events
        self._pending, self._pending_alerts, self._pending_events = set(), False, False
        if runs is not None and not runs and not alerts:
            return
        for sub in self._subs:
            sub.runs = merged(sub.runs, runs)
            sub.alerts |= alerts
            sub.events |= events
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

    def strain_when(self, strained: Callable[[], bool]) -> None:
        """Tick every :data:`STRAINED_INTERVAL_S` instead while ``strained()`` (the web side's judgement:
        heavy ingest on saturated cores, see :mod:`.budget`)."""
        self._strained = strained

    def busy(self) -> bool:
        """Whether the ingest committed at least :data:`HEAVY_STEPS_S` steps a second over the last :data:`BUSY_S`."""
        self._forget_old()
        return self._recent_steps >= HEAVY_STEPS_S * BUSY_S

    def _forget_old(self) -> None:
        horizon = time.monotonic() - BUSY_S
        while self._recent and self._recent[0][0] < horizon:
            self._recent_steps -= self._recent.popleft()[1]

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
