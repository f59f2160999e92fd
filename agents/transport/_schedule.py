"""When the agent's thread works and when it sleeps: pure, driven by the clock readings it is given.

The thread makes a pass (pack the buffered steps, seal the open batch when a flush is due, push a heartbeat
when one is due), then sleeps until the earliest of its timers or until it is woken. A flush is due every
``flush_interval``, at once for a ``flush()``; a heartbeat every ``heartbeat_interval``. ``log()`` wakes a
sleeping thread once :attr:`WakeSchedule.wake_after` steps wait, so that their metric dicts are packed (and
freed) while their memory is still warm.

A *quiet spell*: no step packed for a whole flush interval and nothing left to seal. Then the thread drops its
flush timer and sleeps until a heartbeat is due or ``log()`` wakes it at the first step, and that step is
sealed a flush interval later, as any step: an idle or slow loop's agent wakes per heartbeat, not several
times a second (each wake-up of an asyncio thread costs a Python-bound training thread on the same core more
than its own run).
"""

from __future__ import annotations

import math


class WakeSchedule:
    """The agent thread's timers and its sleep; every method takes ``now`` (``time.monotonic()``)."""

    def __init__(self, flush_interval: float, heartbeat_interval: float, wake_after: int, now: float) -> None:
        self.flush_interval = flush_interval
        self.heartbeat_interval = heartbeat_interval
        self.wake_after = wake_after
        """Steps waiting that end a sleep (outside a quiet spell)."""
        self.quiet = False
        """The last pass found a quiet spell: the thread sleeps through it until the first step logged wakes it,
        and the first pass after it seals that step a flush interval later."""
        self._next_flush = now + flush_interval
        self._next_heartbeat = now
        self._packed_at = -math.inf

    def packed(self, now: float) -> None:
        """The pass at ``now`` packed steps. The first after a quiet spell is sealed a flush interval from now, as
        any step (the pass that packed it stays short: it only packs)."""
        if self.quiet:
            self._next_flush = now + self.flush_interval
        self._packed_at = now

    def seal_due(self, now: float, flushing: bool = False) -> bool:
        """Whether the pass at ``now`` seals the open batch (a flush interval passed, or a ``flush()`` waits);
        if so, the next seal is a flush interval later."""
        if not flushing and now < self._next_flush:
            return False
        self._next_flush = now + self.flush_interval
        return True

    def heartbeat_due(self, now: float) -> bool:
        """Whether the pass at ``now`` sends a heartbeat; if so, the next is a heartbeat interval later."""
        if now < self._next_heartbeat:
            return False
        self._next_heartbeat = now + self.heartbeat_interval
        return True

    def rest(self, now: float, open_rows: int) -> float:
        """After the pass at ``now``, with ``open_rows`` packed and not sealed: when to wake at the latest. In a
        quiet spell (:attr:`quiet`) only a heartbeat is due; otherwise the next seal too."""
        self.quiet = not open_rows and now - self._packed_at >= self.flush_interval
        return self._next_heartbeat if self.quiet else min(self._next_flush, self._next_heartbeat)

    def log_wakes_at(self, sleeping: bool) -> int:
        """What ``log()`` is told: wake the thread when it finds this many steps waiting (before its own). 0 while
        it is ``sleeping`` through a quiet spell; else one less than :attr:`wake_after`."""
        return 0 if sleeping and self.quiet else self.wake_after - 1

    def idle(self, waiting: int) -> bool:
        """Whether ``waiting`` steps let the thread sleep: none in a quiet spell, fewer than :attr:`wake_after`
        otherwise."""
        return not waiting if self.quiet else waiting < self.wake_after
