"""Tumbling windows of step times that close at ``min_steps`` values *and* ``min_seconds``.

Shared by ``slowdown`` (one rank against its own best) and ``straggler`` (one rank against
the fastest rank). A window holds at most its own values, so memory stays O(window).
"""

from __future__ import annotations

import numpy as np

from ._robust import segment_medians
from ._series import Values


class Windows:
    """Collects values and yields each closed window as (last step, last time, median)."""

    __slots__ = ("_steps", "_times", "_values", "min_seconds", "min_steps")

    def __init__(self, min_steps: int, min_seconds: float) -> None:
        self.min_steps, self.min_seconds = min_steps, min_seconds
        self._steps: list[np.ndarray] = []
        self._times: list[np.ndarray] = []
        self._values: list[np.ndarray] = []

    def feed(self, v: Values) -> list[tuple[int, float, float]]:
        finite = np.isfinite(v.value) & (v.value > 0)
        self._steps.append(v.step[finite])
        self._times.append(v.time[finite])
        self._values.append(v.value[finite])
        steps, times, values = (np.concatenate(x) for x in (self._steps, self._times, self._values))
        ends: list[int] = []
        start = 0
        while len(values) - start >= self.min_steps:
            by_count = start + self.min_steps - 1
            by_time = int(np.searchsorted(times, times[start] + self.min_seconds, side="left"))
            end = max(by_count, by_time)
            if end >= len(values):
                break
            ends.append(end)
            start = end + 1
        closed: list[tuple[int, float, float]] = []
        if ends:
            segment = np.repeat(np.arange(len(ends)), np.diff(np.r_[-1, ends]))
            _, medians = segment_medians(values[:start], segment)
            closed = [(int(steps[e]), float(times[e]), float(m)) for e, m in zip(ends, medians, strict=True)]
        self._steps, self._times, self._values = [steps[start:]], [times[start:]], [values[start:]]
        return closed


def severity_of(score: float, warn: float, page: float) -> int:
    """0, 1 (warn) or 2 (page) for a speed score (1 = as fast as the reference)."""
    return 2 if score < page else 1 if score < warn else 0
