"""Giving the GIL back: the worker's work comes in slices, and a slice never holds the GIL for long.

CPython hands the GIL to a waiting thread only after the switch interval (5 ms), and a holder
that drops it for an instant (a non-blocking ``select``) usually takes it straight back, which
restarts the waiter's 5 ms. So the worker measures its own run and, once it has worked
``budget`` seconds without a real pause, sleeps ``pause`` seconds: long enough for a waiting
training thread to wake and take the GIL, short enough to cost the worker little.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BUDGET = 0.0005
"""Seconds of work between pauses: with one slice's overrun, a hold stays under ~1 ms."""
PAUSE = 0.00005
"""Seconds each pause sleeps (the kernel's timer slack adds about as much)."""


class Pacer:
    """Call it between slices of work; it sleeps once ``budget`` seconds ran since the last pause."""

    def __init__(
        self,
        budget: float = BUDGET,
        pause: float = PAUSE,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.budget = budget
        self.pause = pause
        self._clock = clock
        self._sleep = sleep
        self._since = clock()

    def rested(self) -> None:
        """The thread just blocked (waited for work): its run starts afresh."""
        self._since = self._clock()

    def __call__(self) -> None:
        if self._clock() - self._since >= self.budget:
            self._sleep(self.pause)
            self._since = self._clock()
