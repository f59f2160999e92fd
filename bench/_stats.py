"""Statistics the side-by-side benches share."""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Sequence


def median_interval(ratios: Sequence[float], rounds: int = 5000, seed: int = 0) -> tuple[float, float]:
    """A bootstrap 95 % interval of the median of ``ratios`` (the pairs resampled with replacement)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


# Student's t, two-sided 95 %, by degrees of freedom (1-30); beyond, the normal's 1.96 is close enough.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)  # fmt: skip


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """A 95 % interval of the mean of ``values`` (Student's t): for a few independent runs' results, where
    what differs between runs (placement, memory layout) is the noise, not the samples inside one."""
    if len(values) < 2:
        raise ValueError("a spread needs two values at least")
    df = len(values) - 1
    half = (_T95[df - 1] if df <= len(_T95) else 1.96) * statistics.stdev(values) / len(values) ** 0.5
    mean = statistics.fmean(values)
    return mean - half, mean + half


def step_times(marks: Sequence[float], lead: int = 0) -> tuple[float, float]:
    """The mean and the median step between clock ``marks`` (one before the first step, one after each),
    the first ``lead`` steps left out. Judge an agent by the mean: its thread's work once per flush
    interval lands on a few steps in a thousand, which the median leaves out."""
    timed = marks[lead:]
    if len(timed) < 2:
        raise ValueError(f"{len(marks) - 1} steps cannot have {lead} left out and one timed")
    return (timed[-1] - timed[0]) / (len(timed) - 1), statistics.median(b - a for a, b in itertools.pairwise(timed))
