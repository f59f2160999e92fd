"""The seams around the detectors: a detector that raises, state that must not outlive its run,
and detectors switched off in the configuration (pure: batches in, alerts out, no broker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import structlog

from trainvigil.daemon import detectors
from trainvigil.daemon.batch.decode import IngestBatch, StepColumns
from trainvigil.daemon.batch.from_arrays import batch_of, chunks, step_columns_of
from trainvigil.daemon.config import load
from trainvigil.daemon.detectors import Detectors, run_all, select_runs
from trainvigil.daemon.detectors._lifecycle import RunTracker
from trainvigil.daemon.detectors._series import StreamKey, Values, streams
from trainvigil.daemon.detectors.grad_spike import GradSpike
from trainvigil.daemon.detectors.stall import Stall
from trainvigil.daemon.detectors.straggler import Straggler
from trainvigil.errors import ConfigError
from trainvigil.schemas import Anomaly, CheckpointDigest, GilSample, Heartbeat, RunEnd, RunStart, Source

RUNS = ("a", "bad", "c")


class Boom(GradSpike):
    """grad_spike with a bug: it raises judging run ``bad`` once that run reaches step 600."""

    name: ClassVar[str] = "boom"

    def __init__(self, settings: object) -> None:
        super().__init__(settings)
        self.saw: list[set[str]] = []

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        self.saw.append({part.source.run_id for part in batch.steps})
        return super().__call__(batch)

    def judge(self, key: StreamKey, state: object, v: Values) -> list[Anomaly]:
        if key[0] == "bad" and v.step[-1] >= 600:
            raise ZeroDivisionError("a bug in the detector")
        return super().judge(key, state, v)  # type: ignore[arg-type]


def _grad_norms(seed: int) -> np.ndarray:
    values = np.exp(np.random.default_rng(seed).normal(0, 0.1, 1024))
    values[600:603] *= 50  # one spike per run, inside the batch where ``bad`` first raises
    return values


def _parts(run_id: str, seed: int) -> list[StepColumns]:
    """Steps 0-1023 of one run in four batches of 256."""
    return chunks(step_columns_of(run_id, 0, np.arange(1024), {"grad_norm": _grad_norms(seed)}), 256)


class Hasty(Boom):
    """Boom that moves its watermark before judging (as ``slowdown`` does): a rerun of the batch cannot fail."""

    name: ClassVar[str] = "hasty"

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        self.saw.append({part.source.run_id for part in batch.steps})
        out: list[Anomaly] = []
        for key, steps in streams(batch).items():
            state = self.state(key)
            v = steps.metric(self.settings.metric).after(state.watermark)
            if len(v):
                state.watermark = int(v.step[-1])
                out.extend(self.judge(key, state, v))
        return out


def _tables() -> Any:
    """The default detector settings (built by defstruct: their fields are not known statically)."""
    return load(None, env={}).detectors


def _with_boom(kind: type[Boom] = Boom) -> tuple[Detectors, Boom]:
    tables = _tables()
    dets = detectors.build(tables)
    boom = kind(tables.grad_spike)
    dets.append(boom)
    return dets, boom


def _alerts(found: list[Anomaly], detector: str) -> list[tuple[str, int | None, str, str]]:
    return [(a.run_id, a.step, a.state, a.severity) for a in found if a.detector == detector]


def test_a_raising_detector_loses_only_its_run_and_the_other_runs_alerts_still_arrive() -> None:
    dets, boom = _with_boom()
    per_run = [_parts(run, seed) for seed, run in enumerate(RUNS)]
    found: list[Anomaly] = []
    with structlog.testing.capture_logs() as logs:
        for k in range(4):
            found.extend(run_all(dets, batch_of(*[parts[k] for parts in per_run], now=1000.0 + k)))
    reference = _alerts(found, "grad_spike")
    assert {r[0] for r in reference} == set(RUNS), "every run spikes, and grad_spike saw every run"
    # ``a`` was judged before ``bad`` raised (its alert comes from the journal), ``c`` after (from the rerun).
    assert _alerts(found, "boom") == [r for r in reference if r[0] != "bad"]
    assert dets.failures.errors == {"boom": 1}
    assert dets.failures.disabled == {"boom": {"bad"}}
    failed = [entry for entry in logs if entry["event"] == "detector_failed"]
    assert [(e["detector"], e["run_id"], e["log_level"]) for e in failed] == [("boom", "bad", "error")]
    assert "ZeroDivisionError" in failed[0]["error"]
    assert boom.saw[-1] == {"a", "c"}, "while disabled, the detector sees the batch without that run"
    assert "bad" not in {key[0] for key in boom._streams}, "its state for the run is dropped"


def test_a_failure_the_rerun_cannot_reproduce_is_pinned_on_its_run_in_the_next_batch() -> None:
    dets, hasty = _with_boom(Hasty)
    per_run = [_parts(run, seed) for seed, run in enumerate(RUNS)]
    found: list[Anomaly] = []
    with structlog.testing.capture_logs() as logs:
        for k in range(3):
            found.extend(run_all(dets, batch_of(*[parts[k] for parts in per_run], now=1000.0 + k)))
        assert dets.failures.suspect.keys() == {"hasty"} and not dets.failures.disabled
        assert not logs, "not logged before it is pinned on a run"
        found.extend(run_all(dets, batch_of(*[parts[3] for parts in per_run], now=1003.0)))
    assert _alerts(found, "hasty") == [r for r in _alerts(found, "grad_spike") if r[0] != "bad"]
    assert dets.failures.errors == {"hasty": 1} and dets.failures.disabled == {"hasty": {"bad"}}
    assert not dets.failures.suspect
    assert [(e["detector"], e["run_id"]) for e in logs if e["event"] == "detector_failed"] == [("hasty", "bad")]
    assert hasty.saw[-3:] == [{"a"}, {"bad"}, {"c"}], "the suspect's batch went to it run by run"


def test_a_disabled_run_is_given_back_when_it_ends_and_a_new_run_start_sees_it_fail_again() -> None:
    dets, boom = _with_boom()
    bad = Source(run_id="bad")
    for k, part in enumerate(_parts("bad", 1)):
        run_all(dets, batch_of(part, now=1000.0 + k))
    assert dets.failures.disabled == {"boom": {"bad"}}
    run_all(dets, IngestBatch(run_ends=[(bad, RunEnd(time=1010.0))], now=1010.0))
    assert dets.failures.disabled == {}, "its run_end gives the run back"
    with structlog.testing.capture_logs() as logs:
        restart = IngestBatch(run_starts=[(bad, RunStart(time=1020.0))], now=1020.0)
        restart.steps.extend(_parts("bad", 2)[:2])
        run_all(dets, restart)
        assert "bad" in boom.saw[-1], "a new run_start of the run is judged again"
        for k, part in enumerate(_parts("bad", 2)[2:]):
            run_all(dets, batch_of(part, now=1021.0 + k))
    assert dets.failures.errors == {"boom": 2}
    assert [(e["detector"], e["run_id"]) for e in logs if e["event"] == "detector_failed"] == [("boom", "bad")]


def test_a_new_run_start_gives_a_disabled_run_back() -> None:
    dets, _ = _with_boom()
    for k, part in enumerate(_parts("bad", 1)):
        run_all(dets, batch_of(part, now=1000.0 + k))
    assert dets.failures.disabled == {"boom": {"bad"}}
    run_all(dets, IngestBatch(run_starts=[(Source(run_id="bad"), RunStart(time=1010.0))], now=1010.0))
    assert dets.failures.disabled == {}


def test_a_detector_sees_the_same_batch_object_unless_one_of_its_runs_is_disabled() -> None:
    seen: list[IngestBatch] = []

    class Spy(Stall):
        name: ClassVar[str] = "spy"

        def __call__(self, batch: IngestBatch) -> list[Anomaly]:
            seen.append(batch)
            return super().__call__(batch)

    dets = Detectors([Spy(_tables().stall)])
    batch = batch_of(*[_parts(run, i)[0] for i, run in enumerate(RUNS)], now=1.0)
    run_all(dets, batch)
    dets.failures.disabled["spy"] = {"not-in-this-batch"}
    run_all(dets, batch)
    dets.failures.disabled["spy"] = {"bad"}
    run_all(dets, batch)
    assert seen[0] is batch and seen[1] is batch
    assert seen[2] is not batch and {p.source.run_id for p in seen[2].steps} == {"a", "c"}


def test_a_failure_of_runs_together_is_counted_every_time_logged_once_and_costs_no_alert() -> None:
    class Crowded(GradSpike):
        """Raises on any batch of more than one run (but judges each run alone well)."""

        name: ClassVar[str] = "crowded"

        def __call__(self, batch: IngestBatch) -> list[Anomaly]:
            if len({part.source.run_id for part in batch.steps}) > 1:
                raise IndexError("runs mixed up")
            return super().__call__(batch)

    dets, _ = _with_boom()
    dets.append(Crowded(_tables().grad_spike))
    per_run = [_parts(run, seed) for seed, run in enumerate(RUNS)]
    found: list[Anomaly] = []
    with structlog.testing.capture_logs() as logs:
        for k in range(4):
            found.extend(run_all(dets, batch_of(*[parts[k] for parts in per_run], now=1000.0 + k)))
    assert sorted(_alerts(found, "crowded")) == sorted(_alerts(found, "grad_spike"))
    assert dets.failures.errors["crowded"] == 2, "raised on batches 0 and 2; batches 1 and 3 went run by run"
    assert "crowded" not in dets.failures.disabled
    assert [(e["detector"], e["run_id"]) for e in logs if e["detector"] == "crowded"] == [("crowded", None)]


def test_a_failure_on_batches_of_no_run_is_counted_every_time_and_logged_once() -> None:
    class Brittle(Stall):
        """Raises on batches that carry no steps (the daemon's idle ticks)."""

        name: ClassVar[str] = "brittle"

        def __call__(self, batch: IngestBatch) -> list[Anomaly]:
            if not batch.steps:
                raise RuntimeError("empty batch")
            return super().__call__(batch)

    tables = _tables()
    dets = Detectors([Brittle(tables.stall), *detectors.build(tables)])
    with structlog.testing.capture_logs() as logs:
        run_all(dets, batch_of(_parts("a", 0)[0], now=0.0))
        for now in (10.0, 20.0, 200.0):
            found = run_all(dets, IngestBatch(now=now))
    assert dets.failures.errors == {"brittle": 3} and dets.failures.disabled == {}
    assert [(e["detector"], e["run_id"]) for e in logs if e["event"] == "detector_failed"] == [("brittle", None)]
    assert [(a.detector, a.run_id) for a in found] == [("stall", "a")], "the other detectors went on"


def test_run_all_refuses_a_plain_list_that_cannot_keep_its_bookkeeping() -> None:
    with pytest.raises(TypeError, match="Detectors"):
        run_all(list(detectors.build(load(None, env={}).detectors)), IngestBatch())  # type: ignore[arg-type]


def test_select_runs_keeps_or_drops_whole_runs_and_leaves_the_batch_alone() -> None:
    a, b = Source(run_id="a"), Source(run_id="b", rank=1)
    batch = batch_of(_parts("a", 0)[0], _parts("b", 1)[0], now=5.0)
    batch.heartbeats += [(a, Heartbeat(time=1.0)), (b, Heartbeat(time=2.0))]
    batch.run_ends.append((b, RunEnd(time=3.0)))
    batch.anomalies.append(Anomaly(time=1.0, run_id="b", rank=1, step=1, detector="wire", severity="warn"))
    batch.wire_anomalies = 1
    batch.cache["streams"] = {}
    only_b = select_runs(batch, {"b"})
    without_b = select_runs(batch, {"b"}, keep=False)
    assert [p.source.run_id for p in only_b.steps] == ["b"] and [p.source.run_id for p in without_b.steps] == ["a"]
    assert [s.run_id for s, _ in only_b.heartbeats] == ["b"] and len(only_b.run_ends) == 1
    assert without_b.run_ends == [] and without_b.anomalies == [] and without_b.wire_anomalies == 0
    assert only_b.wire_anomalies == 1 and only_b.now == 5.0 and only_b.cache == {}
    assert len(batch.steps) == 2 and len(batch.heartbeats) == 2 and "streams" in batch.cache


# ---- bounded state ------------------------------------------------------------------------

GROUP, RANKS, STEPS = 100, 2, 8
SHORT_RUNS = 3_000
"""Short runs in the two tests below: 30 groups of 100, far more than any bound they assert lets live."""
METRICS = ("loss", "grad_norm", "step_time", "reward", "entropy", "kl", "response_len")


def _gil(time: float) -> GilSample:
    return GilSample(
        time=time,
        period=1.0,
        samples=100,
        wait_p50=0.0,
        wait_p90=0.0,
        wait_p99=0.0,
        wait_max=0.0,
        busy_share=0.5,
        wait_share=0.0,
        held=0.5,
        switch_interval=0.005,
    )


def _short_runs(group: int, now: float) -> IngestBatch:
    """A run_start, a few steps, a heartbeat, a GIL sample and a parity digest on every rank of GROUP runs."""
    batch = IngestBatch(now=now)
    steps = np.arange(STEPS)
    times = now - STEPS + steps.astype(float)
    for i in range(GROUP):
        run_id = f"run-{group}-{i}"
        for rank in range(RANKS):
            source = Source(run_id=run_id, rank=rank, world_size=RANKS)
            values = {m: np.full(STEPS, 0.5) for m in METRICS}
            values["loss"][-1] = np.nan  # non_finite keeps state only for a stream that gave it something to say
            part = step_columns_of(run_id, rank, steps, values, times)
            part.source = source
            batch.steps.append(part)
            batch.run_starts.append((source, RunStart(time=now - STEPS)))
            batch.heartbeats.append((source, Heartbeat(time=now)))
            batch.gil_samples.append((source, _gil(now)))
            digest = CheckpointDigest(time=now, step=STEPS - 1, algo="blake3", root="same", origin="parity")
            batch.checkpoints.append((source, digest))
    return batch


def _ends(group: int, rank: int, now: float) -> list[tuple[Source, RunEnd]]:
    return [(Source(run_id=f"run-{group}-{i}", rank=rank), RunEnd(time=now)) for i in range(GROUP)]


@pytest.mark.slow
def test_thousands_of_short_runs_that_end_leave_no_state_behind() -> None:
    """Rank 0 ends one batch after the run's start, rank 1 one batch later: run-level state waits for both."""
    dets = detectors.build(load(None, env={}).detectors)
    groups = SHORT_RUNS // GROUP
    peak = dict.fromkeys(dets.tracked(), 0)
    for g in range(groups + 2):
        now = 1000.0 + 10.0 * g
        batch = _short_runs(g, now) if g < groups else IngestBatch(now=now)
        if 1 <= g <= groups:
            batch.run_ends += _ends(g - 1, 0, now)
        if g >= 2:
            batch.run_ends += _ends(g - 2, 1, now)
        run_all(dets, batch)
        tracked = dets.tracked()
        peak = {name: max(peak[name], n) for name, n in tracked.items()}
        if g == 1:
            assert all(tracked.values()), f"every detector holds state for live runs: {tracked}"
            straggler = next(d for d in dets if d.name == "straggler")
            assert isinstance(straggler, Straggler)
            assert "run-0-0" in straggler._runs, "rank 1 of run-0-0 is still live: its run-level state stays"
    assert dets.tracked() == dict.fromkeys(peak, 0)
    assert len(dets.runs) == 0
    assert max(peak.values()) <= 3 * GROUP * RANKS, f"bounded by the runs live at once, not by {SHORT_RUNS}: {peak}"


@pytest.mark.slow
def test_thousands_of_runs_that_just_stop_are_forgotten_after_the_idle_horizon() -> None:
    env = {"VIGIL_DETECTORS_IDLE_FORGET_S": "100", "VIGIL_DETECTORS_RUN_FAILED_LOST_AFTER_S": "60"}
    dets = detectors.build(load(None, env=env).detectors)
    groups = SHORT_RUNS // GROUP
    peak = dict.fromkeys(dets.tracked(), 0)
    now = 1000.0
    for g in range(groups):
        now = 1000.0 + 10.0 * g
        run_all(dets, _short_runs(g, now))
        peak = {name: max(peak[name], n) for name, n in dets.tracked().items()}
    assert any(dets.tracked().values()), "the latest runs are still within the horizon"
    run_all(dets, IngestBatch(now=now + 130.0))
    assert dets.tracked() == dict.fromkeys(peak, 0)
    assert len(dets.runs) == 0
    # Forgotten between 1 and 1.25 horizons (100-125 s) after their last record: at most 14 groups of 10 s live.
    assert max(peak.values()) <= 2 * 14 * GROUP * RANKS, f"bounded by the horizon, not by {SHORT_RUNS}: {peak}"


def test_run_tracker_ends_a_run_with_its_last_rank_and_a_restart_in_the_same_batch_keeps_it() -> None:
    tracker = RunTracker(idle_forget_s=60.0)
    r0, r1 = Source(run_id="r", rank=0), Source(run_id="r", rank=1)
    tracker.observe(IngestBatch(heartbeats=[(r0, Heartbeat(time=1.0)), (r1, Heartbeat(time=1.0))], now=1.0))
    first = tracker.observe(IngestBatch(run_ends=[(r0, RunEnd(time=2.0))], now=2.0))
    assert (first.streams, first.runs) == ([("r", 0)], [])
    restarted = IngestBatch(run_ends=[(r1, RunEnd(time=3.0))], run_starts=[(r1, RunStart(time=4.0))], now=4.0)
    assert not tracker.observe(restarted) and tracker.ranks("r") == [1]
    last = tracker.observe(IngestBatch(run_ends=[(r1, RunEnd(time=5.0))], now=5.0))
    assert (last.streams, last.runs) == ([("r", 1)], ["r"]) and len(tracker) == 0


# ---- switched off in the configuration ----------------------------------------------------


def test_a_detector_switched_off_in_toml_or_the_environment_is_not_built(tmp_path: Path) -> None:
    toml = tmp_path / "vigil.toml"
    toml.write_text("[detectors]\nidle_forget_s = 600\n[detectors.grad_spike]\nenabled = false\n")
    dets = detectors.build(load(toml, env={"VIGIL_DETECTORS_STALL_ENABLED": "0"}).detectors)
    names = [d.name for d in dets]
    assert "grad_spike" not in names and "stall" not in names and "loss_spike" in names
    assert dets.runs.idle_forget_s == 600.0
    everything = detectors.build(load(None, env={"VIGIL_DETECTORS_STALL_ENABLED": "true"}).detectors)
    assert [d.name for d in everything] == [d.name for d in detectors.REGISTRY]


def test_an_idle_horizon_that_is_not_positive_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="idle_forget_s"):
        load(None, env={"VIGIL_DETECTORS_IDLE_FORGET_S": "0"})
