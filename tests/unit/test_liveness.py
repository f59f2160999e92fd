"""The liveness state machine (``alive → hung → silent → lost``): one episode per incident, on decoded batches whose
``now`` is the clock."""

from __future__ import annotations

import numpy as np
import pytest

from trainvigil.daemon import detectors
from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.batch.from_arrays import batch_of, step_columns_of
from trainvigil.daemon.config import load
from trainvigil.daemon.detectors import Detectors, run_all
from trainvigil.schemas import Anomaly, Heartbeat, RunEnd, RunStart, Source

SRC = Source(run_id="run", rank=0)
SHORT = {
    "VIGIL_DETECTORS_STALL_MIN_SECONDS": "20",
    "VIGIL_DETECTORS_HANG_MIN_SECONDS": "10",
    "VIGIL_DETECTORS_HANG_ALIVE_S": "15",
    "VIGIL_DETECTORS_RUN_FAILED_LOST_AFTER_S": "100",
}
"""No step for 10 s while heartbeats come: hung; silent 20 s: stall; silent 100 s: lost."""


def _dets(**env: str) -> Detectors:
    return detectors.build(load(None, env={**SHORT, **env}).detectors)


def _steps(first: int, n: int, t0: float) -> IngestBatch:
    part = step_columns_of("run", 0, np.arange(first, first + n), {"loss": np.ones(n)}, time=t0 + np.arange(n) * 0.1)
    return batch_of(part, now=t0 + n * 0.1)


def _beat(now: float, last_step: int) -> IngestBatch:
    return IngestBatch(heartbeats=[(SRC, Heartbeat(time=now, last_step=last_step))], now=now)


def _tick(dets: Detectors, start: float, stop: float, beat_step: int | None = None) -> list[Anomaly]:
    """Idle batches once a second over [start, stop), with a heartbeat naming ``beat_step`` in each if given."""
    out: list[Anomaly] = []
    for now in np.arange(start, stop, 1.0):
        batch = IngestBatch(now=float(now)) if beat_step is None else _beat(float(now), beat_step)
        out += run_all(dets, batch)
    return out


def _states(out: list[Anomaly]) -> list[tuple[str, str, str, int | None]]:
    return [(a.detector, a.state, a.severity, a.step) for a in out]


def test_a_rank_that_goes_silent_then_is_lost_is_one_episode_that_escalates() -> None:
    dets = _dets()
    run_all(dets, _steps(0, 50, 0.0))  # last record at t=5
    out = _tick(dets, 6.0, 200.0)
    assert _states(out) == [("stall", "open", "page", 49), ("run_failed", "escalated", "page", 49)]
    silent, lost = out
    assert silent.time == pytest.approx(26.0) and lost.time == pytest.approx(106.0), "20 s, then 100 s of silence"
    assert silent.episode == lost.episode
    assert lost.value == pytest.approx(101.0) and lost.threshold == 100.0
    assert lost.message.startswith("rank 0 vanished after step 49")
    assert f"first paged as stall: {silent.message}" in lost.message


def test_a_hung_rank_that_dies_escalates_hang_to_stall_to_lost() -> None:
    dets = _dets()
    run_all(dets, _steps(0, 50, 0.0))
    out = _tick(dets, 6.0, 30.0, beat_step=49)  # the loop blocks; the agent's heartbeats go on
    assert _states(out) == [("hang", "open", "page", 49)]
    assert out[0].time == pytest.approx(16.0)
    out += _tick(dets, 30.0, 200.0)  # then the heartbeats stop: the process died
    assert _states(out) == [
        ("hang", "open", "page", 49),
        ("stall", "escalated", "page", 49),
        ("run_failed", "escalated", "page", 49),
    ]
    hung, silent, lost = out
    assert hung.episode == silent.episode == lost.episode
    assert silent.time == pytest.approx(50.0) and lost.time == pytest.approx(130.0)
    assert hung.message in silent.message and hung.message in lost.message, "the hang's story stays in the page"


def test_each_detector_returns_the_updates_that_name_it() -> None:
    dets = _dets()
    by_name = {d.name: d for d in dets}
    run_all(dets, _steps(0, 50, 0.0))
    for now in np.arange(6.0, 30.0, 1.0):
        run_all(dets, _beat(float(now), 49))
    got: dict[str, list[str]] = {"stall": [], "hang": [], "run_failed": []}
    for now in np.arange(30.0, 200.0, 1.0):
        batch = IngestBatch(now=float(now))
        for name in got:
            got[name] += [f"{a.detector} {a.state}" for a in by_name[name](batch)]
    assert got == {"stall": ["stall escalated"], "hang": [], "run_failed": ["run_failed escalated"]}


def test_progress_clears_the_episode_and_the_next_silence_is_a_new_one() -> None:
    dets = _dets(VIGIL_DETECTORS_STALL_FACTOR="1")  # the 35 s gap becomes the pace: the next limit is 35 s
    run_all(dets, _steps(0, 50, 0.0))
    (first,) = _tick(dets, 6.0, 40.0)
    (cleared,) = run_all(dets, _steps(50, 10, 40.0))
    assert (cleared.state, cleared.episode, cleared.detector) == ("cleared", first.episode, "stall")
    (second,) = _tick(dets, 42.0, 90.0)
    assert (second.detector, second.state, second.step) == ("stall", "open", 59)
    assert second.episode != first.episode and second.threshold == pytest.approx(35.1)


def test_a_lost_rank_that_speaks_again_clears_and_if_it_still_does_not_step_hang_pages_anew() -> None:
    dets = _dets()
    run_all(dets, _steps(0, 50, 0.0))
    lost = _tick(dets, 6.0, 120.0)[-1]
    assert (lost.detector, lost.state) == ("run_failed", "escalated")
    back = {a.state: a for a in run_all(dets, _beat(120.0, 49))}
    assert sorted(back) == ["cleared", "open"]
    assert back["cleared"].episode == lost.episode, "it was not lost: vigil runs no longer says so"
    hung = back["open"]
    assert (hung.detector, hung.step) == ("hang", 49) and hung.episode != lost.episode, "alive, but 115 s at step 49"
    assert _tick(dets, 121.0, 130.0, beat_step=49) == []


def test_heartbeats_that_resume_after_a_stall_neither_clear_it_nor_page_again() -> None:
    dets = _dets()
    run_all(dets, _steps(0, 50, 0.0))
    (silent,) = _tick(dets, 6.0, 40.0)
    assert _tick(dets, 40.0, 300.0, beat_step=49) == [], "alive again but still stuck: the stall page stands"
    (cleared,) = run_all(dets, _beat(300.0, 50))
    assert (cleared.episode, cleared.state) == (silent.episode, "cleared"), "a higher last_step is progress"


def test_an_error_run_end_after_a_hang_page_escalates_that_episode_and_ends_it() -> None:
    dets = _dets()
    run_all(dets, _steps(0, 50, 0.0))
    (hung,) = _tick(dets, 6.0, 20.0, beat_step=49)
    end = RunEnd(time=25.0, last_step=49, status="error", error="RuntimeError: NCCL timeout")
    (failed,) = run_all(dets, IngestBatch(run_ends=[(SRC, end)], now=25.0))
    assert (failed.detector, failed.state, failed.episode, failed.step) == ("run_failed", "escalated", hung.episode, 49)
    assert "RuntimeError: NCCL timeout" in failed.message and hung.message in failed.message
    assert _tick(dets, 26.0, 300.0) == [] and all(d.tracked() == 0 for d in dets if d.name == "stall")


def test_an_error_run_end_with_nothing_open_opens_its_own_page_and_a_clean_one_clears() -> None:
    dets = _dets()
    run_all(dets, _steps(0, 50, 0.0))
    end = RunEnd(time=6.0, last_step=49, status="error", error="ValueError: bad batch")
    (failed,) = run_all(dets, IngestBatch(run_ends=[(SRC, end)], now=6.0))
    assert (failed.detector, failed.state, failed.step) == ("run_failed", "open", 49)

    clean = _dets()
    run_all(clean, _steps(0, 50, 0.0))
    (silent,) = _tick(clean, 6.0, 30.0)
    (cleared,) = run_all(clean, IngestBatch(run_ends=[(SRC, RunEnd(time=30.0, last_step=49))], now=30.0))
    assert (cleared.episode, cleared.state) == (silent.episode, "cleared")
    assert _tick(clean, 31.0, 300.0) == [], "an ended rank is never lost"


@pytest.mark.parametrize(
    ("off", "expected"),
    [
        ("RUN_FAILED", [("stall", "open")]),
        ("STALL", [("run_failed", "open")]),
    ],
)
def test_a_stage_switched_off_is_skipped_the_others_still_page_once(off: str, expected: list[tuple[str, str]]) -> None:
    dets = _dets(**{f"VIGIL_DETECTORS_{off}_ENABLED": "false"})
    run_all(dets, _steps(0, 50, 0.0))
    assert [(a.detector, a.state) for a in _tick(dets, 6.0, 200.0)] == expected


def test_with_stall_off_a_hung_rank_that_dies_escalates_from_hang_straight_to_lost() -> None:
    dets = _dets(VIGIL_DETECTORS_STALL_ENABLED="false")
    run_all(dets, _steps(0, 50, 0.0))
    out = _tick(dets, 6.0, 30.0, beat_step=49) + _tick(dets, 30.0, 200.0)
    assert [(a.detector, a.state) for a in out] == [("hang", "open"), ("run_failed", "escalated")]
    assert out[0].episode == out[1].episode


def test_a_detector_built_alone_judges_its_own_stage_only() -> None:
    (stall,) = [d for d in _dets() if d.name == "stall"]
    alone = type(stall)(stall.settings)  # type: ignore[call-arg, attr-defined]
    alone(_steps(0, 50, 0.0))
    out: list[Anomaly] = []
    for now in np.arange(6.0, 300.0, 1.0):
        out += alone(IngestBatch(now=float(now)))
    assert [(a.detector, a.state) for a in out] == [("stall", "open")], "no run_failed stage in it"


def test_a_rank_that_never_stepped_is_still_judged_silent_then_lost_before_its_first_step() -> None:
    dets = _dets()
    run_all(dets, IngestBatch(run_starts=[(SRC, RunStart(time=0.0))], now=0.0))
    out = _tick(dets, 1.0, 120.0)
    assert _states(out) == [("stall", "open", "page", None), ("run_failed", "escalated", "page", None)]
    assert "vanished before its first step" in out[1].message
