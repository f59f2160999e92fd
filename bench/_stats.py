"""Statistics the side-by-side benches share."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence


def median_interval(ratios: Sequence[float], rounds: int = 5000, seed: int = 0) -> tuple[float, float]:
    """A bootstrap 95 % interval of the median of ``ratios`` (the pairs resampled with replacement)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]
