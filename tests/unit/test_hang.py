"""``hang``: progress, not liveness. Pure detector logic on decoded batches,
plus the agent's stack probe on a real blocked thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from trainvigil.agents._stuck import StuckProbe
from trainvigil.daemon import detectors
from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.batch.from_arrays import batch_of, step_columns_of
from trainvigil.daemon.config import load
from trainvigil.daemon.detectors.hang import Hang
from trainvigil.schemas import Anomaly, Heartbeat, RunEnd, RunEvent, Source

STEP_S = 0.1  # a healthy loop: 10 steps/s, so 20 x p99 = 2 s and the 60 s floor rules


def _hang(**settings: float) -> Hang:
    (hang,) = [d for d in detectors.build(load(None, env={}).detectors) if d.name == "hang"]
    assert isinstance(hang, Hang)
    if settings:
        hang = Hang(Hang.Settings(**settings))  # type: ignore[arg-type]
    return hang


def _steps(rank: int, first: int, n: int, t0: float) -> IngestBatch:
    part = step_columns_of(
        "run", rank, np.arange(first, first + n), {"loss": np.ones(n)}, time=t0 + STEP_S * np.arange(n)
    )
    return batch_of(part, now=t0 + STEP_S * n)


def _beat(rank: int, now: float, last_step: int, stack: list[str] | None = None) -> IngestBatch:
    beat = Heartbeat(time=now, last_step=last_step, stack=stack or [])
    return IngestBatch(heartbeats=[(Source(run_id="run", rank=rank), beat)], now=now)


def _pages(out: list[Anomaly]) -> list[tuple[str, int | None, str]]:
    return [(a.state, a.step, a.severity) for a in out]


def test_a_blocked_loop_whose_heartbeats_arrive_pages_after_the_floor_and_clears_on_progress() -> None:
    hang = _hang()
    assert hang(_steps(0, 0, 1000, 0.0)) == []
    stuck_at = 100.0
    out: list[Anomaly] = []
    for now in np.arange(105.0, 161.0, 5.0):  # heartbeats every 5 s, last_step frozen at 999
        out += hang(_beat(0, float(now), 999))
    assert out == [], "under the 60 s floor: a long step is not a hang"
    opened = hang(_beat(0, stuck_at + 65.0, 999, ["train.py:40 train", "distributed_c10d.py:2501 all_reduce"]))
    assert _pages(opened) == [("open", 999, "page")]
    assert "no progress for" in opened[0].message and "heartbeats still arrive" in opened[0].message
    assert opened[0].threshold == pytest.approx(60.0)
    assert hang(_beat(0, stuck_at + 70.0, 999)) == [], "one episode, not a storm"
    assert [a.state for a in hang(_beat(0, stuck_at + 75.0, 1000))] == ["cleared"]


def test_the_limit_follows_a_slow_loops_own_pace() -> None:
    hang = _hang(factor=20.0, min_seconds=10.0)
    part = step_columns_of("run", 0, np.arange(50), {"loss": np.ones(50)}, time=2.0 * np.arange(50))
    hang(batch_of(part, now=100.0))  # one step per 2 s: the limit is 20 x 2 s = 40 s
    assert hang(_beat(0, 135.0, 49)) == []
    opened = hang(_beat(0, 145.0, 49))
    assert _pages(opened) == [("open", 49, "page")]
    assert opened[0].threshold == pytest.approx(40.0)
    assert "p99 step time" in opened[0].message


def test_a_frozen_process_without_heartbeats_is_stalls_not_hangs() -> None:
    hang = _hang()
    hang(_steps(0, 0, 100, 0.0))
    hang(_beat(0, 15.0, 99))
    assert hang(IngestBatch(now=200.0)) == [], "no heartbeat for 185 s: not alive, stall's case"


def test_a_declared_eval_phase_does_not_page_until_its_own_bound() -> None:
    hang = _hang(phase_max_s=600.0)
    hang(_steps(0, 0, 100, 0.0))
    src = Source(run_id="run", rank=0)
    hang(IngestBatch(events=[(src, RunEvent(time=10.0, kind="eval", step=99))], now=10.0))
    for now in range(15, 600, 5):
        assert hang(_beat(0, float(now), 99)) == [], f"an evaluation of {now} s is expected"
    assert _pages(hang(_beat(0, 620.0, 99))) == [("open", 99, "page")]


def test_the_message_says_whether_one_rank_or_every_rank_is_stuck() -> None:
    hang = _hang()
    for rank in (0, 1, 2):
        hang(_steps(rank, 0, 100, 0.0))
    out: list[Anomaly] = []
    for now in range(15, 100, 5):
        out += hang(_beat(0, float(now), 99))
        out += hang(_beat(1, float(now), 99 + now))  # ranks 1 and 2 progress
        out += hang(_beat(2, float(now), 99 + now))
    (one,) = [a for a in out if a.state == "open"]
    assert one.rank == 0 and "2 of 2 other ranks still progress" in one.message

    everyone = _hang()
    for rank in (0, 1, 2):
        everyone(_steps(rank, 0, 100, 0.0))
    out = []
    for now in range(15, 100, 5):
        for rank in (0, 1, 2):
            out += everyone(_beat(rank, float(now), 99))
    opened = [a for a in out if a.state == "open"]
    assert {a.rank for a in opened} == {0, 1, 2}
    assert any("all 3 ranks are stuck" in a.message for a in opened)


def test_a_clean_run_end_forgets_the_stream() -> None:
    hang = _hang()
    hang(_steps(0, 0, 100, 0.0))
    src = Source(run_id="run", rank=0)
    hang(IngestBatch(run_ends=[(src, RunEnd(time=11.0, last_step=99))], now=11.0))
    assert hang.tracked() == 0


def test_the_stack_from_the_heartbeat_names_where_the_loop_is_stuck() -> None:
    hang = _hang()
    hang(_steps(0, 0, 100, 0.0))
    hang(_beat(0, 15.0, 99))
    frames = ["train.py:88 main", "train.py:40 train_step", "distributed_c10d.py:2501 all_reduce"]
    (opened,) = hang(_beat(0, 80.0, 99, frames))
    assert "stuck in distributed_c10d.py:2501 all_reduce <- train.py:40 train_step" in opened.message


def test_the_agents_probe_samples_a_really_blocked_thread_only_once_its_step_stops() -> None:
    release = threading.Event()

    def blocked_in_collective() -> None:
        release.wait(30)

    thread = threading.Thread(target=blocked_in_collective)
    thread.start()
    try:
        probe = StuckProbe(thread.ident, after_s=0.2)
        assert probe.sample(10) == [], "a step never seen before is progress"
        assert probe.sample(10) == [], "not stuck long enough yet"
        time.sleep(0.3)  # the probe's own clock: after_s must pass with the step unchanged
        frames = probe.sample(10)
        assert frames and any("blocked_in_collective" in f for f in frames), frames
        assert all(len(f) <= 256 for f in frames)
        assert probe.sample(11) == [], "progress resets it"
    finally:
        release.set()
        thread.join()


def _run_failed(**settings: float) -> detectors.Detector:
    (det,) = [d for d in detectors.build(load(None, env={}).detectors) if d.name == "run_failed"]
    if settings:
        # **floats into a Settings that also has a bool field; the Detector protocol declares no __init__
        det = type(det)(type(det).Settings(**settings))  # type: ignore[call-arg, arg-type]
    return det


def test_a_rank_that_vanishes_without_run_end_is_lost_after_the_horizon_and_clears_if_it_speaks() -> None:
    det = _run_failed(lost_after_s=120.0)
    det(_steps(0, 0, 100, 0.0))  # last record at t=10
    assert det(IngestBatch(now=100.0)) == []
    (lost,) = det(IngestBatch(now=131.0))
    assert (lost.state, lost.severity, lost.step) == ("open", "page", 99)
    assert lost.value == pytest.approx(121.0) and "vanished after step 99" in lost.message
    assert det(IngestBatch(now=200.0)) == [], "one page, not one per tick"
    (back,) = det(_beat(0, 210.0, 99))
    assert back.state == "cleared"


def test_an_error_run_end_pages_at_once_and_a_clean_one_never() -> None:
    det = _run_failed()
    det(_steps(0, 0, 100, 0.0))
    det(_steps(1, 0, 100, 0.0))
    src0, src1 = Source(run_id="run", rank=0), Source(run_id="run", rank=1)
    out = det(
        IngestBatch(
            run_ends=[
                (src0, RunEnd(time=11.0, last_step=99, status="error", error="RuntimeError: CUDA out of memory")),
                (src1, RunEnd(time=11.0, last_step=99)),
            ],
            now=11.0,
        )
    )
    assert [(a.rank, a.severity, a.step) for a in out] == [(0, "page", 99)]
    assert "RuntimeError: CUDA out of memory" in out[0].message
    assert det(IngestBatch(now=5000.0)) == [], "ended ranks are never lost"


def test_a_declared_phase_spares_a_long_pause_and_a_reported_eval_does_not() -> None:
    hang = _hang()
    src = Source(run_id="run", rank=0)
    hang(_steps(0, 0, 100, 0.0))
    start = RunEvent(time=10.0, kind="phase", step=99, fields={"name": "checkpoint", "state": "start"})
    hang(IngestBatch(events=[(src, start)], now=10.0))
    for now in range(15, 300, 5):
        assert hang(_beat(0, float(now), 99)) == [], "a declared checkpoint save of 5 minutes is no hang"
    end = RunEvent(time=300.0, kind="phase", step=99, fields={"name": "checkpoint", "state": "end"})
    assert hang(IngestBatch(events=[(src, end)], now=300.0)) == [], "the end of a phase is progress"
    out = []
    for now in range(305, 380, 5):
        out += hang(_beat(0, float(now), 99))
    assert [a.state for a in out] == ["open"], "60 s after the phase ended without a step: stuck"

    reported = _hang()
    reported(_steps(0, 0, 100, 0.0))
    result = RunEvent(time=10.0, kind="eval", step=99, fields={"val_loss": 1.75})
    reported(IngestBatch(events=[(src, result)], now=10.0))
    out = []
    for now in range(15, 90, 5):
        out += reported(_beat(0, float(now), 99))
    assert [a.state for a in out] == ["open"], "an eval that reports results is over: no phase"
