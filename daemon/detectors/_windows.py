"""Sliding windows of step times: the last ``min_steps`` values *and* ``min_seconds``.

Shared by ``slowdown`` (one rank against its own best). A window is judged every half
window (its hop), so a change is seen by the first window where it is the majority, at most
one window after it starts, and two consecutive judged windows stay within two windows of
the change. History is trimmed to the current window, so memory stays O(window).

A window is at least ``min_seconds`` long, so a fast loop puts many values in it: 35 000 steps
a second (a tight loop logging flat out) would hold a million values per stream and copy them at
every batch. Past ``MAX_VALUES`` values per ``min_seconds`` a stream keeps every k-th value it logs
(k from its own pace, held across batches), so a window holds about ``MAX_VALUES`` values. Every
k-th by step, not by time: sampling by time would favour the long steps that straddle an instant.
Below that pace (136 steps a second with the 30 s default) nothing is left out.
"""

from __future__ import annotations

import math

import numpy as np

from trainvigil.daemon.detectors._robust import fast_median
from trainvigil.daemon.detectors._series import Values

MAX_VALUES = 4096
"""Values a window of ``min_seconds`` holds at most (about): a faster stream keeps every k-th value
(k a power of two, so that a larger k keeps a subset of what a smaller one kept)."""
PACE_S = 1.0
"""The stream's pace (values per second) is measured over at least this long; k follows each measurement."""


class Windows:
    """Collects values and yields each judged window as (last step, last time, median)."""

    __slots__ = (
        "_counted",
        "_counting_from",
        "_index",
        "_next",
        "_seen",
        "_steps",
        "_stride",
        "_times",
        "_values",
        "min_seconds",
        "min_steps",
    )

    def __init__(self, min_steps: int, min_seconds: float) -> None:
        self.min_steps, self.min_seconds = min_steps, min_seconds
        self._steps = np.empty(0, dtype=np.int64)
        self._times = np.empty(0)
        self._values = np.empty(0)
        self._index = np.empty(0, dtype=np.int64)
        """Per held value: its place among every value offered (the stride keeps multiples of itself)."""
        self._next = min_steps - 1
        """Index (into the held history) of the next window's last value."""
        self._stride = 1
        """Keep the values whose offered place is a multiple of this power of two (1 below ``MAX_VALUES``)."""
        self._seen = 0
        """Values offered so far, kept or not."""
        self._counting_from = math.nan
        self._counted = 0
        """Values offered since ``_counting_from`` (a time): the pace being measured."""

    def feed(self, v: Values) -> list[tuple[int, float, float]]:
        index = self._seen + np.arange(len(v.value), dtype=np.int64)
        self._seen += len(index)
        self._pace(v.time)
        keep = np.isfinite(v.value) & (v.value > 0)
        if self._stride > 1:
            keep &= index % self._stride == 0
        steps = np.concatenate([self._steps, v.step[keep]])
        times = np.concatenate([self._times, v.time[keep]])
        values = np.concatenate([self._values, v.value[keep]])
        index = np.concatenate([self._index, index[keep]])
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
        self._index = index[keep_from:]
        self._next = end - keep_from
        return judged

    def _pace(self, times: np.ndarray) -> None:
        """Count the values offered; once ``PACE_S`` has passed, set the stride from their pace. A larger
        stride thins the held history too, so that every window holds values at one density."""
        if not len(times):
            return
        if math.isnan(self._counting_from):
            self._counting_from, self._counted = float(times[0]), 0
        self._counted += len(times)
        span = float(times[-1]) - self._counting_from
        if span < PACE_S:
            return
        per_window = self._counted * self.min_seconds / span
        stride = 1 << max(0, int(per_window // MAX_VALUES).bit_length() - 1)
        self._counting_from, self._counted = float(times[-1]), 0
        if stride > self._stride:
            held = self._index % stride == 0
            ahead = max(0, self._next - len(held)) * self._stride // stride  # an end not offered yet
            self._next = int(np.count_nonzero(held[: self._next])) + ahead
            self._steps, self._times, self._values = self._steps[held], self._times[held], self._values[held]
            self._index = self._index[held]
        self._stride = stride


def severity_of(score: float, warn: float, page: float) -> int:
    """0, 1 (warn) or 2 (page) for a speed score (1 = as fast as the reference)."""
    return 2 if score < page else 1 if score < warn else 0
