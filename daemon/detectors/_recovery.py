"""Recovered means recovered: a metric's level when an episode opened, and whether it is back.

A detector that flags a level (loss, KL) keeps one :class:`Recovery` per stream: it notes
the level before the incident when an episode opens and the latest values as they come;
``Episodes(unrecovered=...)`` asks :meth:`Recovery.unrecovered` before clearing, so an episode
whose metric settled clearly worse stays open (state ``degraded``) instead of reading as over.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class Recovery:
    """The level before the open episode, and the median of the latest ``recent`` values."""

    __slots__ = ("before", "recent", "since")

    def __init__(self, recent: int) -> None:
        self.recent: deque[float] = deque(maxlen=recent)
        self.before = float("nan")
        """The metric's level when the open episode began (NaN: none noted)."""
        self.since = -1
        """The step it began at."""

    def opened(self, level: float, step: int) -> None:
        self.before, self.since = level, step

    def push(self, values: np.ndarray) -> None:
        finite = values[np.isfinite(values)]
        self.recent.extend(finite[-(self.recent.maxlen or 0) :].tolist())

    def unrecovered(self, ratio: float, what: str) -> str:
        """Why the episode may not clear ("" when the recent median is within ``ratio`` x the level before)."""
        if not self.recent or not self.before > 0:
            return ""
        now = float(np.median(self.recent))
        if now <= ratio * self.before:
            return ""
        return (
            f"{what} settled at {now:.4g} (median of the last {len(self.recent)} steps), "
            f"{now / self.before:.1f}x its level {self.before:.4g} when this began at step {self.since}"
        )
