"""The GIL probe (``agents/gil/_probe.py``): its wait summary, the kernel wake timer, and the fallback clock."""

from __future__ import annotations

import sys

import pytest

from trainvigil.agents.gil._probe import BUSY_WAIT, Probe, WakeTimer, summarize

MS = 1e-3


def test_summary_percentiles_and_held_estimate() -> None:
    """held = W + B(1 - W): waits of a switch interval after each sleep mean ~fully held, not W = 0.5."""
    waits = [5 * MS] * 100
    s = summarize(waits, elapsed=1.0)
    assert s.wait_share == pytest.approx(0.5) and s.busy_share == 1.0 and s.held == 1.0
    quiet = summarize([0.0] * 98 + [20 * MS] * 2, elapsed=1.0)
    assert quiet.wait_p50 == quiet.wait_p90 == 0.0 and quiet.wait_max == quiet.wait_p99 == 20 * MS, (
        "nearest-rank percentiles"
    )
    assert quiet.busy_share == pytest.approx(0.02) and quiet.held == pytest.approx(0.04 + 0.02 * 0.96)
    assert summarize([BUSY_WAIT] * 10, 1.0).busy_share == 0.0, "exactly the threshold is not busy"
    assert summarize([], 1.0).samples == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_the_wake_timer_sleeps_its_time_and_says_the_kernels_lateness_in_whole_periods() -> None:
    import time

    timer = WakeTimer()
    assert timer.available
    try:
        for seconds in (0.002, 0.0005, 0.004):
            t0 = time.perf_counter()
            late = timer.sleep(seconds)
            took = time.perf_counter() - t0
            assert took >= seconds * 0.999, (seconds, took)
            periods = late / WakeTimer.period
            assert late >= 0 and abs(periods - round(periods)) < 1e-6, late
            assert late <= took - seconds + WakeTimer.period, "the kernel's part is inside the whole lateness"
    finally:
        timer.close()


def test_a_probe_whose_timer_fails_goes_on_with_the_run_queue_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = Probe(mean_sleep=0.001, seed=1)
    probe.open()
    try:
        timer = probe._timer
        if timer is None:
            pytest.skip("no timerfd here: the probe runs on the clock already")
        # Arming fails from now on: the probe must notice and fall back.
        monkeypatch.setattr(timer, "_settime", lambda *args: -1)
        assert probe.once() == 0.0, "that sleep's lateness is unknown"
        clock = probe._clock
        assert probe._timer is None and not timer.available, "the timer is closed"
        assert probe.corrects_run_queue == (clock is not None and clock.available)
        assert all(probe.once() >= 0.0 for _ in range(5))
    finally:
        probe.close()
