"""A sleep that another thread can end early, at the cost of one future and one timer per sleep.

``asyncio.wait_for(event.wait(), timeout)`` does the same with a task for the wait, and at the timeout
cancels that task, lets it run once more to finish, and raises and catches ``TimeoutError``: on the
agent's thread, which sleeps and wakes at every flush, that is ~100 µs of CPU per wake-up more,
taken from the training thread's core (``bench/agent_thread_cpu.py``).
"""

from __future__ import annotations

import asyncio


class Alarm:
    """Ends the sleep of one task on one event loop. :meth:`ring` runs on the loop's thread (another
    thread schedules it with ``loop.call_soon_threadsafe``); a ring before the sleep is kept for it."""

    def __init__(self) -> None:
        self._rung = False
        self._waiter: asyncio.Future[None] | None = None

    def ring(self) -> None:
        """End the current sleep, or the next one if none is under way."""
        self._rung = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def clear(self) -> None:
        """Forget a ring that no sleep took."""
        self._rung = False

    async def sleep(self, timeout: float) -> None:
        """Until :meth:`ring` (at once if it rang since the last :meth:`clear`) or ``timeout`` seconds."""
        if self._rung or timeout <= 0:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
