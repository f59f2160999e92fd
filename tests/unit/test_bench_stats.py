"""The side-by-side benches' statistics (``bench/_stats.py``): pure functions, checked on known inputs."""

from __future__ import annotations

import pytest
from _stats import mean_interval, median_interval, step_times


def test_step_times_leave_out_the_lead_and_count_a_rare_long_step_in_the_mean_only() -> None:
    marks = [0.0, 5.0, 6.0, 7.0, 8.0, 9.0, 19.0]  # a slow first step (the lead), then four of 1 and one of 10
    mean, median = step_times(marks, lead=1)
    assert mean == pytest.approx(14.0 / 5)
    assert median == pytest.approx(1.0)
    assert step_times(marks) == (pytest.approx(19.0 / 6), pytest.approx(1.0))


def test_step_times_refuse_a_lead_that_leaves_no_step() -> None:
    with pytest.raises(ValueError, match="cannot have 3 left out"):
        step_times([0.0, 1.0, 2.0], lead=3)


def test_intervals_hold_their_centre_and_narrow_with_agreement() -> None:
    low, high = mean_interval([1.00, 1.02, 1.01, 0.99])
    assert low < 1.005 < high
    wide = mean_interval([0.9, 1.1, 1.0, 0.95])
    assert high - low < wide[1] - wide[0]
    with pytest.raises(ValueError):
        mean_interval([1.0])
    low, high = median_interval([1.0] * 9 + [2.0])
    assert low == high == 1.0
