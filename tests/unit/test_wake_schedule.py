"""The agent thread's wake-up and flush schedule (``agents/transport/_schedule.py``), driven by a fake clock:
plain floats."""

from __future__ import annotations

from trainvigil.agents.transport._schedule import WakeSchedule

FLUSH = 1.0
HEARTBEAT = 5.0


def _schedule(now: float = 100.0, wake_after: int = 1024) -> WakeSchedule:
    return WakeSchedule(FLUSH, HEARTBEAT, wake_after, now)


def test_the_first_pass_sends_a_heartbeat_and_seals_nothing_before_a_flush_interval() -> None:
    s = _schedule()
    assert s.heartbeat_due(100.0), "a heartbeat at once: the daemon learns the run is alive"
    assert not s.heartbeat_due(100.0), "then not again until its interval passed"
    assert not s.seal_due(100.5)
    assert s.seal_due(101.0)
    assert not s.seal_due(101.5), "the next seal is a flush interval after the last"
    assert s.seal_due(102.0)
    assert not s.heartbeat_due(104.9) and s.heartbeat_due(105.0)


def test_a_flush_seals_at_once_and_restarts_the_flush_timer() -> None:
    s = _schedule()
    assert s.seal_due(100.3, flushing=True)
    assert not s.seal_due(101.0), "sealed 0.3 s ago: the timer restarted from the flush"
    assert s.seal_due(101.3)


def test_a_steady_logger_is_never_quiet_and_wakes_for_its_next_seal() -> None:
    s = _schedule()
    s.heartbeat_due(100.0)
    for tick in range(1, 20):
        now = 100.0 + 0.05 * tick
        s.packed(now)
        s.seal_due(now)
        wake_at = s.rest(now, open_rows=1)
        assert not s.quiet
        assert wake_at == 101.0, (now, wake_at)
    assert s.log_wakes_at(sleeping=True) == 1023, "log() wakes it only once a full wake-up's worth of steps wait"


def test_a_flush_interval_without_a_step_and_nothing_to_seal_is_a_quiet_spell_until_the_heartbeat() -> None:
    s = _schedule()
    s.heartbeat_due(100.0)
    s.packed(100.2)
    assert s.rest(100.2, open_rows=1) == 101.0 and not s.quiet
    s.seal_due(101.0)
    assert s.rest(101.0, open_rows=0) == 101.0 + FLUSH and not s.quiet, "a step 0.8 s ago: not quiet yet"
    assert s.rest(101.5, open_rows=0) == 105.0, "quiet: it sleeps until the heartbeat, not the next flush"
    assert s.quiet
    assert s.log_wakes_at(sleeping=True) == 0, "the first step logged wakes it"
    assert s.log_wakes_at(sleeping=False) == 1023, "once awake, log() is told the usual again"
    assert not s.idle(1) and s.idle(0)


def test_rows_left_to_seal_are_never_a_quiet_spell() -> None:
    s = _schedule()
    s.heartbeat_due(100.0)
    assert s.rest(150.0, open_rows=3) == 101.0 and not s.quiet


def test_the_first_step_after_a_quiet_spell_is_sealed_a_flush_interval_after_it_was_packed() -> None:
    s = _schedule()
    s.heartbeat_due(100.0)
    s.rest(103.0, open_rows=0)
    assert s.quiet
    s.packed(104.0)  # log() woke it at the step
    assert not s.seal_due(104.0), "the old flush timer (due since 101) does not seal it at once"
    assert s.rest(104.0, open_rows=1) == 105.0 and not s.quiet
    assert not s.seal_due(104.9) and s.seal_due(105.0)


def test_outside_a_quiet_spell_a_full_wake_up_of_steps_ends_the_sleep() -> None:
    s = _schedule(wake_after=8)
    s.packed(100.0)
    s.rest(100.0, open_rows=0)
    assert not s.quiet
    assert s.idle(7) and not s.idle(8)
    assert s.log_wakes_at(sleeping=True) == 7
