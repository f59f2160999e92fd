"""The benchmark's numbers from plain lists (pure): final loss, steps to half, intervals, Welch's t-test.

Student's t distribution is computed here (the regularised incomplete beta function by its
continued fraction) so the benchmark needs no SciPy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

FINAL_SHARE = 0.05
"""The final loss is the mean over this last share of the steps."""


def final_loss(losses: Sequence[float]) -> float:
    """Mean of the last 5% of ``losses`` (at least one)."""
    tail = losses[-max(1, math.ceil(len(losses) * FINAL_SHARE)) :]
    return sum(tail) / len(tail)


def steps_to_half(losses: Sequence[float]) -> int | None:
    """First step whose loss is at most half the first step's; ``None`` if none is."""
    if not losses:
        return None
    target = losses[0] / 2
    return next((i for i, loss in enumerate(losses) if loss <= target), None)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` (0-100) percentile, linear between the closest ranks."""
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(at), math.ceil(at)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)``."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_sf2(t: float, df: float) -> float:
    """Two-sided tail probability of Student's t with ``df`` degrees of freedom."""
    return _betainc(df / 2, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t, by bisection."""
    lo, hi = 0.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_sf2(mid, df) / 2 > 1 - p else (lo, mid)
    return (lo + hi) / 2


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its ``level`` t interval (``nan`` with fewer than two values)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's t statistic of ``mean(a) - mean(b)`` and its two-sided p-value (``nan`` if undefined)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    if va + vb == 0:
        return (0.0, 1.0) if ma == mb else (math.copysign(math.inf, ma - mb), 0.0)
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t, t_sf2(t, df)
