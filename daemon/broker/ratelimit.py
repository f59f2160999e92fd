"""Rate limits of the answering side: a token bucket per asker, and log lines that say a flood once a second.

Pure logic with the clock passed in, so both are tested without a broker.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

OVERFLOW = ""
"""The asker every new one shares while :class:`Buckets` tracks its most already."""


class Buckets:
    """A token bucket per asker: ``rate`` requests a second, ``burst`` at once; for ``most`` askers at most.

    A bucket left alone for ``burst / rate`` seconds is full again, the same as a new one, so it is
    forgotten: only askers of the last few seconds are kept, least recently seen first. Past ``most``
    of them, a new asker shares one overflow bucket, so a flood of made-up inboxes is limited as one
    asker and cannot grow memory; the askers already tracked keep their own buckets meanwhile.
    """

    def __init__(self, rate: float, burst: int, most: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.most = rate, float(burst), most
        self._clock = clock
        self._refill_s = self.burst / rate
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """asker -> (tokens, when they were counted); least recently seen first."""

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, asker: str) -> bool:
        """Whether ``asker`` may ask now (a token taken) or is over its rate (nothing taken)."""
        now = self._clock()
        buckets = self._buckets
        while buckets and now - next(iter(buckets.values()))[1] >= self._refill_s:
            buckets.popitem(last=False)  # full again: the same as no bucket
        if asker not in buckets and len(buckets) >= self.most:
            asker = OVERFLOW
        tokens, then = buckets.pop(asker, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        allowed = tokens >= 1.0
        buckets[asker] = (tokens - 1.0 if allowed else tokens, now)
        return allowed


class Tally:
    """One kind of event, logged as one line ``every_s`` seconds at most: the first at once, the ones after it
    counted into the next line (``count``: events since the line before, this one included).

    Events after the last line wait for the next event to be said; the metrics that go with them count
    every one at once.
    """

    def __init__(self, log: Any, event: str, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._log, self._event, self._every_s, self._clock = log, event, every_s, clock
        self._count = 0
        self._said = -float("inf")

    def add(self, **fields: Any) -> None:
        """One event; ``fields`` describe it (the line shows those of the event that made it)."""
        self._count += 1
        now = self._clock()
        if now - self._said >= self._every_s:
            self._log.warning(self._event, count=self._count, **fields)
            self._said, self._count = now, 0
