"""Sliding windows of step times: the last ``min_steps`` values *and* ``min_seconds``.

Shared by ``slowdown`` (one rank against its own best). A window is judged every half
window (its hop), so a change is seen by the first window where it is the majority, at most
one window after it starts, and two consecutive judged windows stay within two windows of
the change. History is trimmed to the current window, so memory stays O(window).
"""

from __future__ import annotations

import numpy as np

from trainvigil.daemon.detectors._robust import fast_median
from trainvigil.daemon.detectors._series import Values


class Windows:
    """Collects values and yields each judged window as (last step, last time, median)."""

    __slots__ = ("_next", "_steps", "_times", "_values", "min_seconds", "min_steps")

    def __init__(self, min_steps: int, min_seconds: float) -> None:
        self.min_steps, self.min_seconds = min_steps, min_seconds
        self._steps = np.empty(0, dtype=np.int64)
        self._times = np.empty(0)
        self._values = np.empty(0)
        self._next = min_steps - 1
        """Index (into the held history) of the next window's last value."""

    def feed(self, v: Values) -> list[tuple[int, float, float]]:
        finite = np.isfinite(v.value) & (v.value > 0)
        steps = np.concatenate([self._steps, v.step[finite]])
        times = np.concatenate([self._times, v.time[finite]])
        values = np.concatenate([self._values, v.value[finite]])
        judged: list[tuple[int, float, float]] = []
        end, keep_from = self._next, 0
        while end < len(values):
            by_time = int(np.searchsorted(times, times[end] - self.min_seconds, side="right")) - 1
            start = min(end - self.min_steps + 1, by_time)
            if start < 0:  # not a full window of history yet: jump to the first end that has one
                first_by_time = int(np.searchsorted(times, times[0] + self.min_seconds, side="left"))
                end = max(end + 1, self.min_steps - 1, first_by_time)
                continue
            judged.append((int(steps[end]), float(times[end]), fast_median(values[start : end + 1])))
            keep_from = start
            end += max(1, (end - start + 1) // 2)
        # Keep what the next window can still reach: everything from the last window's start.
        keep_from = max(0, min(keep_from, len(values) - self.min_steps))
        self._steps, self._times, self._values = steps[keep_from:], times[keep_from:], values[keep_from:]
        self._next = end - keep_from
        return judged


def severity_of(score: float, warn: float, page: float) -> int:
    """0, 1 (warn) or 2 (page) for a speed score (1 = as fast as the reference)."""
    return 2 if score < page else 1 if score < warn else 0
