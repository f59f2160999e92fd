"""Recovered means recovered: a metric's level when an episode opened, and whether it is back.

A detector that flags a level (loss, KL) keeps one :class:`Recovery` per stream: it notes
the level before the incident when an episode opens and the latest values as they come;
``Episodes(unrecovered=...)`` asks :meth:`Recovery.unrecovered` before clearing, so an episode
whose metric settled clearly worse stays open (state ``degraded``) instead of reading as over.
"""

from __future__ import annotations

import numpy as np


class Recovery:
    """The level before the open episode, and the median of the latest ``recent`` values."""

    __slots__ = ("before", "positions", "since", "size", "values")

    def __init__(self, recent: int) -> None:
        self.size = recent
        self.positions = np.empty(0, dtype=np.int64)
        self.values = np.empty(0)
        """The latest finite values and their positions: the last batch's and ``recent`` before it,
        so any position of the batch being judged can look back ``recent`` values."""
        self.before = float("nan")
        """The metric's level when the open episode began (NaN: none noted)."""
        self.since = -1
        """The step it began at."""

    def opened(self, level: float, step: int) -> None:
        self.before, self.since = level, step

    def push(self, positions: np.ndarray, values: np.ndarray) -> None:
        finite = np.isfinite(values)
        keep = int(finite.sum()) + self.size
        self.positions = np.concatenate([self.positions, positions[finite]])[-keep:]
        self.values = np.concatenate([self.values, values[finite]])[-keep:]

    def unrecovered(self, ratio: float, what: str, at: int) -> str:
        """Why the episode may not clear at position ``at`` ("" when the median of the ``size`` values
        up to ``at`` is within ``ratio`` x the level before). Only values up to ``at`` count, so the
        answer does not depend on how far the batch being judged reaches."""
        if not self.before > 0:
            return ""
        upto = self.values[self.positions <= at][-self.size :]
        if not len(upto):
            return ""
        now = float(np.median(upto))
        if now <= ratio * self.before:
            return ""
        return (
            f"{what} settled at {now:.4g} (median of the last {len(upto)} steps), "
            f"{now / self.before:.1f}x its level {self.before:.4g} when this began at step {self.since}"
        )
