"""The corpus of real runs (tests/data/corpus/): manifests agree with their data, and the evaluation runs on all of it.

Today's detection quality is not asserted here (the detectors are being fixed against this
corpus; ``bench/corpus_eval.py`` prints it): these tests pin what the corpus and the
harness must get right whatever the detectors do.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Literal

import corpus_eval
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from corpus import load
from corpus.runs import BY_NAME, PLANNED
from corpus.score import score

from trainvigil.daemon import detectors
from trainvigil.daemon.cli.replay import batches
from trainvigil.daemon.config import DaemonConfig
from trainvigil.schemas import Anomaly

RUNS = load.runs()
KNOWN_DETECTORS = {d.name for d in detectors.REGISTRY} | set(PLANNED)


def test_the_corpus_holds_clean_and_faulty_runs_of_every_workload() -> None:
    workloads = Counter((r.manifest["workload"], r.fault is None) for r in RUNS)
    for workload in ("ppo", "supervised", "gpt"):
        assert workloads[(workload, True)] >= 1, f"no clean {workload} run"
        assert workloads[(workload, False)] >= 1, f"no faulty {workload} run"
    size = sum(f.stat().st_size for f in load.CORPUS.rglob("*") if f.is_file())
    assert size < 8 * 2**20, f"the corpus is {size / 2**20:.1f} MiB; keep it under 8"


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_manifest_agrees_with_the_recorded_rows(run: load.Run) -> None:
    spec = BY_NAME[run.name]  # every recorded run is one the recorder can regenerate
    m = run.manifest
    assert (m["workload"], m["ranks"], tuple(m["expected"])) == (spec.workload, spec.ranks, spec.expected)
    steps = run.steps
    assert set(steps["run_id"].to_pylist()) == {run.name}
    for rank in range(m["ranks"]):
        mine = steps.filter(pc.equal(steps["rank"], rank))
        assert mine.num_rows == m["steps"][str(rank)] > 0
        assert pc.max(mine["step"]).as_py() == m["last_step"][str(rank)]
        assert pc.count_distinct(mine["step"]).as_py() == mine.num_rows, "one row per (rank, step)"
    for name, rows in m["rows"].items():
        assert run.table(name).num_rows == rows
    assert set(m["expected"]) <= KNOWN_DETECTORS, "an expected detector is neither registered nor planned"
    fault = run.fault
    if fault is None:
        assert spec.clean and not m["expected"]
        return
    assert fault.kind == spec.fault and fault.step == spec.fault_at
    assert m["expected"] and (m["budget"]["steps"] is not None or m["budget"]["seconds"] is not None)
    ranks = [fault.rank] if fault.rank is not None else list(range(m["ranks"]))
    for rank in ranks:
        mine = steps.filter(pc.equal(steps["rank"], rank))
        assert pc.min(mine["step"]).as_py() < fault.step <= pc.max(mine["step"]).as_py() + 1, "fault inside the run"
        t0, t1 = pc.min(mine["time"]).as_py(), pc.max(mine["time"]).as_py()
        assert t0 <= fault.time <= t1 + 1.0, "the fault's time lies within the run's steps"


def test_replay_carries_every_recorded_record_once_and_ends_each_rank_when_it_ended() -> None:
    run = next(r for r in RUNS if r.manifest["ranks"] > 1)
    records = run.records()
    got = list(batches(run.steps, records=records))
    beats = sum(len(b.heartbeats) for b in got)
    events = sum(len(b.events) + len(b.run_starts) for b in got)
    assert beats == run.table("heartbeats").num_rows
    assert events + sum(len(b.run_ends) for b in got) == run.table("events").num_rows
    ends = {source.rank: (i, end.time) for i, b in enumerate(got) for source, end in b.run_ends}
    assert sorted(ends) == list(range(run.manifest["ranks"])), "one run_end per rank, the recorded one"
    recorded = {r["rank"]: r["time"] for r in run.table("events").to_pylist() if r["kind"] == "run_end"}
    assert {rank: t for rank, (_, t) in ends.items()} == recorded
    for b in got:
        if b.now is not None:
            assert all(rec.time <= b.now for _, rec in b.sourced_records()), "no record before its time"


def test_evaluation_scores_every_run() -> None:
    config = DaemonConfig()
    scores = corpus_eval.evaluate(RUNS, config)
    assert [s.name for s in scores] == [r.name for r in RUNS]
    for run, s in zip(RUNS, scores, strict=True):
        if run.fault is None:
            assert s.clean_steps == run.steps.num_rows and not s.first and not s.collateral
        else:
            assert 0 < s.clean_steps <= run.steps.num_rows, "a fault run is clean up to its fault"
        for ep in [*s.false_pages, *s.false_warns, *s.collateral]:
            assert ep.detector in KNOWN_DETECTORS
        for catch in s.first.values():
            assert catch.episode.detector in run.expected and catch.steps is not None and catch.steps >= -1
    rows = corpus_eval.detector_rows(scores, RUNS)
    assert {r["detector"] for r in rows} == KNOWN_DETECTORS
    assert all(r["clean_steps"] == sum(s.clean_steps for s in scores) for r in rows)
    faulty = sum(1 for r in RUNS if r.fault is not None)
    assert sum(r["faults"] for r in rows) >= faulty, "every fault run is counted for its expected detectors"
    json.dumps([s.as_json() for s in scores])  # the --json output serialises
    assert "| detector" in corpus_eval.report(scores, rows, "replay")


def test_live_alerts_of_every_run_can_be_scored() -> None:
    for run in RUNS:
        s = score(run, run.live_alerts())
        assert s.clean_steps == run.clean_steps()


def _run(tmp_path: Path, fault: dict[str, object] | None, expected: list[str]) -> load.Run:
    pq.write_table(pa.table({"rank": [0] * 10 + [1] * 10, "step": list(range(10)) * 2}), tmp_path / "steps.parquet")
    manifest = {"name": "t", "ranks": 2, "fault": fault, "expected": expected, "budget": {"steps": 2, "seconds": None}}
    return load.Run(tmp_path, manifest)


def _alert(
    detector: str, rank: int, step: int, time: float, severity: Literal["warn", "page"] = "page", state: str = "open"
) -> Anomaly:
    episode = f"{detector}:t:{rank}:{step}"
    return Anomaly(
        time=time, run_id="t", rank=rank, step=step, detector=detector, severity=severity, state=state, episode=episode
    )


def test_score_counts_alarms_before_the_fault_as_false_and_the_expected_detector_after_it_as_the_catch(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path, {"kind": "x", "step": 5, "time": 105.0, "rank": 1}, ["slowdown"])
    s = score(
        run,
        [
            _alert("grad_spike", 0, 2, 102.0),
            _alert("loss_spike", 1, 3, 103.0, severity="warn"),
            _alert("slowdown", 0, 6, 106.0),  # the wrong rank: collateral
            _alert("slowdown", 1, 8, 108.5, severity="warn"),
            _alert("slowdown", 1, 8, 109.0, state="escalated"),
        ],
    )
    assert [e.detector for e in s.false_pages] == ["grad_spike"]
    assert [e.detector for e in s.false_warns] == ["loss_spike"]
    assert [e.brief() for e in s.collateral] == ["slowdown@6!"]
    catch = s.first["slowdown"]
    assert (catch.steps, catch.seconds, catch.in_budget, catch.episode.page) == (3, 3.5, False, True)
    assert s.clean_steps == 10, "steps before the fault on every rank"
