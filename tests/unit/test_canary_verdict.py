"""Canary verdicts over a real DuckDB store holding hand-made runs: what the runner reads, and the rule it applies."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from trainvigil.daemon.batch.decode import RawMessage, decode_batch
from trainvigil.daemon.canary import evidence
from trainvigil.daemon.canary.catalog import Budget, CanaryPlanError, Plan, plan
from trainvigil.daemon.canary.runner import failed_alert, result_of
from trainvigil.daemon.canary.verdict import Alert, Ending, Evidence, Injection, Verdict, judge, settled
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.store.writer import Store
from trainvigil.schemas import DEFAULT_SUBJECTS, Anomaly, Envelope, Record, RunEnd, RunEvent, RunStart, Source, encode
from trainvigil.schemas.canaries import CLEAN

T = 1_700_000_000.0
RUN = "canary-t1"
OK = Ending(0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "vigil.duckdb")
    yield s
    s.close()


def _plan(fault: str, job: str = "supervised", fault_step: int | None = 50) -> Plan:
    return plan(DaemonConfig(), RUN, fault, job, fault_step=None if fault == CLEAN else fault_step)


def _run(store: Store, *, world: int = 1, injected: tuple[str, int] | None = None, missed: str = "") -> None:
    """A canary run as agents send it: a start and an end per rank, and the fault's event."""
    records: list[tuple[int, Record]] = [(r, RunStart(time=T)) for r in range(world)]
    if injected is not None:
        kind, step = injected
        records.append((0, RunEvent(time=T + step, kind="fault_injected", step=step, fields={"kind": kind})))
    if missed:
        records.append((0, RunEvent(time=T + 99, kind="fault_missed", step=99, fields={"kind": missed, "why": "why"})))
    records += [(r, RunEnd(time=T + 100, last_step=99)) for r in range(world)]
    raw = [
        RawMessage(
            DEFAULT_SUBJECTS.data(RUN, "run"),
            encode(Envelope(source=Source(run_id=RUN, rank=rank, world_size=world), records=[rec])),
            store.last_seq + i,
        )
        for i, (rank, rec) in enumerate(records, start=1)
    ]
    store.write(decode_batch(raw))


def _alerts(store: Store, *alerts: tuple[str, str, int]) -> None:
    """Episodes of the run: (detector, severity, step), opened at time T + step."""
    store.write_anomalies(
        [
            Anomaly(time=T + step, run_id=RUN, rank=0, step=step, detector=d, severity=s, episode=f"{d}:{step}")  # type: ignore[arg-type]
            for d, s, step in alerts
        ]
    )


def _judge(store: Store, chosen: Plan, ending: Ending = OK) -> tuple[str, str, str, int | None]:
    with store.cursor() as con:
        seen = evidence.gather(con, RUN, chosen.fault)
    v = judge(chosen, seen, ending)
    return v.outcome, v.detail, v.fired.detector if v.fired else "", v.latency_steps


def test_the_expected_detector_at_the_fault_step_passes(store: Store) -> None:
    _run(store, injected=("nan_grad", 50))
    _alerts(store, ("non_finite", "page", 50))
    outcome, detail, fired, latency = _judge(store, _plan("nan_grad"))
    assert (outcome, fired, latency) == ("pass", "non_finite", 0)
    assert "non_finite page at step 50" in detail and "deadline 0 steps" in detail


def test_a_detection_past_its_deadline_fails_as_late(store: Store) -> None:
    _run(store, injected=("grad_spike", 50))
    _alerts(store, ("grad_spike", "page", 53))
    outcome, detail, fired, latency = _judge(store, _plan("grad_spike"))
    assert (outcome, fired, latency) == ("fail", "grad_spike", 3)
    assert detail.startswith("late: ") and "deadline 1 steps" in detail


def test_another_detector_paging_fails_even_when_the_expected_one_fired(store: Store) -> None:
    _run(store, injected=("nan_grad", 50))
    _alerts(store, ("non_finite", "page", 50), ("loss_spike", "page", 52), ("grad_spike", "warn", 51))
    outcome, detail, fired, _ = _judge(store, _plan("nan_grad"))
    assert (outcome, fired) == ("fail", "non_finite")
    assert detail.startswith("other detectors paged: loss_spike page at step 52")
    assert "grad_spike" not in detail, "a warning of another detector is not a page"


def test_a_miss_names_what_fired_instead(store: Store) -> None:
    _run(store, injected=("nan_grad", 50))
    _alerts(store, ("loss_spike", "warn", 51))
    outcome, detail, fired, _ = _judge(store, _plan("nan_grad"))
    assert (outcome, fired) == ("fail", "loss_spike")
    assert (
        detail
        == "non_finite raised nothing after the fault at step 50; raised instead: loss_spike warn at step 51 (rank 0)"
    )


def test_an_alert_before_the_fault_fails_the_canary(store: Store) -> None:
    _run(store, injected=("nan_grad", 50))
    _alerts(store, ("slowdown", "warn", 10), ("non_finite", "page", 50))
    outcome, detail, fired, _ = _judge(store, _plan("nan_grad"))
    assert (outcome, fired) == ("fail", "slowdown")
    assert detail.startswith("alerts before the fault at step 50: slowdown warn at step 10")


def test_a_clean_twin_passes_silent_and_fails_on_a_warning(store: Store) -> None:
    _run(store)
    assert _judge(store, _plan(CLEAN))[0] == "pass"
    _alerts(store, ("slowdown", "warn", 30))
    outcome, detail, fired, _ = _judge(store, _plan(CLEAN))
    assert (outcome, fired) == ("fail", "slowdown")
    assert detail == "the clean twin raised alerts: slowdown warn at step 30 (rank 0)"


def test_the_canarys_own_alert_is_never_evidence(store: Store) -> None:
    _run(store)
    _alerts(store, ("canary_failed", "page", 0))
    assert _judge(store, _plan(CLEAN))[0] == "pass"


@pytest.mark.parametrize(
    ("ending", "expected"),
    [
        (Ending(1, last_line="RuntimeError: boom"), "the job exited with status 1: RuntimeError: boom"),
        (Ending(-9, timed_out=True), "still running after timeout_s; its process group was killed"),
        (Ending(None, last_line="cannot start nope: not found"), "the job could not start: cannot start nope"),
    ],
)
def test_a_job_that_crashed_timed_out_or_never_started_is_an_error(store: Store, ending: Ending, expected: str) -> None:
    _run(store, injected=("nan_grad", 50))
    _alerts(store, ("non_finite", "page", 50))
    outcome, detail, _, _ = _judge(store, _plan("nan_grad"), ending)
    assert outcome == "error" and detail.startswith(expected)


def test_a_fault_that_never_went_in_is_an_error_saying_why(store: Store) -> None:
    _run(store, missed="nan_grad")
    outcome, detail, _, _ = _judge(store, _plan("nan_grad"))
    assert (outcome, detail) == ("error", "the fault nan_grad@50 was never injected: why")


def test_a_canary_the_daemon_stopped_is_aborted(store: Store) -> None:
    outcome, detail, _, _ = _judge(store, _plan("nan_grad"), Ending(None, aborted=True))
    assert (outcome, detail) == ("aborted", "the daemon stopped first: its job was killed")


def test_a_job_stopped_on_purpose_is_judged_on_its_evidence() -> None:
    """A stall never lets the job end: the runner stops it once caught, and its exit status is no error."""
    chosen = _plan("stall")
    seen = Evidence(alerts=(), injected=None)
    assert judge(chosen, seen, Ending(-2, stopped=True)).outcome == "error"  # nothing injected: proved nothing

    caught = Evidence(alerts=(Alert("hang", "page", None, T + 75),), injected=Injection(50, T + 1))
    verdict = judge(chosen, caught, Ending(-2, stopped=True))
    assert (verdict.outcome, verdict.latency_steps, verdict.latency_s) == ("fail", None, 74.0)  # past 60 + 10 s
    # hang's page carries the last step completed, before the stalled one: a stall is judged in time.
    on_time = Evidence(alerts=(Alert("hang", "page", 49, T + 61),), injected=Injection(50, T + 1))
    verdict = judge(chosen, on_time, Ending(-2, stopped=True))
    assert (verdict.outcome, verdict.latency_steps, verdict.latency_s) == ("pass", None, 60.0)


def test_a_detection_is_settled_once_the_expected_detector_fired_or_an_alert_came_first() -> None:
    """The runner may stop a job once its detection is settled: nothing later can turn a miss into a pass."""
    chosen, at = _plan("nan_grad"), Injection(50, T + 50)
    assert not settled(chosen, Evidence(alerts=(), injected=None))
    assert not settled(chosen, Evidence(alerts=(), injected=at))
    assert not settled(chosen, Evidence(alerts=(Alert("loss_spike", "page", 52, T + 52),), injected=at))
    assert settled(chosen, Evidence(alerts=(Alert("non_finite", "page", 50, T + 50),), injected=at))
    assert settled(chosen, Evidence(alerts=(Alert("slowdown", "warn", 10, T + 10),), injected=at))  # a fail already
    stall = _plan("stall")  # judged in time: hang's page carries the last step completed, before the fault's
    assert settled(stall, Evidence(alerts=(Alert("hang", "page", 49, T + 61),), injected=Injection(50, T + 1)))
    clean = _plan(CLEAN)
    assert not settled(clean, Evidence(alerts=(Alert("non_finite", "page", 5, T + 5),), injected=None))


def test_a_straggler_may_also_page_slowdown_as_the_detector_evaluation_allows() -> None:
    chosen = _plan("straggler", "two_rank")
    pages = (Alert("straggler", "page", 80, T + 80), Alert("slowdown", "page", 90, T + 90))
    assert judge(chosen, Evidence(alerts=pages, injected=Injection(50, T + 50)), OK).outcome == "pass"
    loss = (*pages, Alert("loss_spike", "page", 95, T + 95))
    assert judge(chosen, Evidence(alerts=loss, injected=Injection(50, T + 50)), OK).outcome == "fail"


def test_every_rank_must_end_before_the_data_counts_as_settled(store: Store) -> None:
    with store.cursor() as con:
        assert not evidence.ended(con, RUN)
    _run(store, world=2)
    with store.cursor() as con:
        assert evidence.ended(con, RUN)
        assert evidence.known_run(con, RUN) and not evidence.known_run(con, "canary-other")


@pytest.mark.parametrize(
    ("budget", "steps", "seconds", "within"),
    [
        (Budget(steps=0), 0, 5.0, True),
        (Budget(steps=0), 1, 0.0, False),
        (Budget(steps=60, seconds=60.0), 500, 30.0, True),  # a window is N steps *and* S s: late only past both
        (Budget(steps=60, seconds=60.0), 500, 61.0, False),
        (Budget(seconds=10.0), None, 9.0, True),
        (Budget(), 10**6, 10.0**6, True),
    ],
)
def test_a_budget_is_missed_only_past_every_limit_it_has(
    budget: Budget, steps: int | None, seconds: float, within: bool
) -> None:
    assert budget.within(steps, seconds) is within


def test_deadlines_follow_the_detector_settings() -> None:
    from trainvigil.daemon import config as config_mod

    cfg = config_mod.load(env={"VIGIL_DETECTORS_SLOWDOWN_MIN_SECONDS": "45"})
    assert plan(cfg, RUN, "slowdown").budget == Budget(steps=40, seconds=90.0)  # 2 x min_steps (20), 2 x 45 s
    assert plan(cfg, RUN, "kl_explode").job.name == "rl"
    assert plan(cfg, RUN, "straggler").job.name == "two_rank"


@pytest.mark.parametrize(
    ("fault", "job", "steps", "error"),
    [
        ("nan_gard", "", None, "unknown fault kind 'nan_gard'"),
        ("nan_grad", "nope", None, "unknown workload or job 'nope'"),
        ("kl_explode", "supervised", None, "supervised does not take kl_explode"),
        ("nan_grad", "supervised", 500, "the fault step 1600 is past the run's 500 steps"),
    ],
)
def test_a_canary_that_cannot_run_as_asked_is_refused_saying_why(
    fault: str, job: str, steps: int | None, error: str
) -> None:
    with pytest.raises(CanaryPlanError, match=error):
        plan(DaemonConfig(), RUN, fault, job, steps)


def test_a_verdict_and_its_page_are_stored_in_one_transaction(store: Store, tmp_path: Path) -> None:
    _run(store, injected=("nan_grad", 50))
    chosen = _plan("nan_grad")
    with store.cursor() as con:
        verdict = judge(chosen, evidence.gather(con, RUN, "nan_grad"), OK)
    result = result_of(chosen, verdict, OK, 12.5)
    alert = failed_alert(chosen, result, tmp_path / "x.log")
    assert alert is not None and alert.severity == "page" and "non_finite no longer catches nan_grad" in alert.message
    store.record_canary(result, [alert])
    row = store.con.execute(
        "SELECT name, workload, fault, verdict, passed, expected_detector, fault_step, exit_code, duration_s "
        "FROM canary_results"
    ).fetchall()
    assert row == [(RUN, "supervised", "nan_grad", "fail", False, "non_finite", 50, 0, 12.5)]
    assert store.con.execute("SELECT detector, severity, step FROM anomalies").fetchall() == [
        ("canary_failed", "page", 50)
    ]


@pytest.mark.parametrize(("outcome", "severity"), [("pass", None), ("aborted", None), ("error", "warn")])
def test_only_a_failed_or_errored_canary_raises_an_alert(outcome: str, severity: str | None, tmp_path: Path) -> None:
    chosen = _plan("nan_grad")
    result = result_of(chosen, Verdict(outcome, "d", 50), OK, 1.0)  # type: ignore[arg-type]
    alert = failed_alert(chosen, result, tmp_path / "x.log")
    assert (alert.severity if alert else None) == severity


def _v2_file(path: Path, rows: Sequence[tuple[str, bool]]) -> None:
    import duckdb

    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE schema_info (version INTEGER); INSERT INTO schema_info VALUES (2)")
        con.execute(
            "CREATE TABLE canary_results (time TIMESTAMPTZ, name VARCHAR, fault VARCHAR, passed BOOLEAN, "
            "expected_detector VARCHAR, fault_step BIGINT, fired_step BIGINT, latency_steps BIGINT, detail VARCHAR)"
        )
        for name, passed in rows:
            con.execute("INSERT INTO canary_results (name, fault, passed) VALUES (?, 'nan_grad', ?)", [name, passed])


def test_a_version_2_file_gains_the_verdict_columns(tmp_path: Path) -> None:
    from trainvigil.daemon.store.schema import SCHEMA_VERSION

    path = tmp_path / "vigil.duckdb"
    _v2_file(path, [("a", True), ("b", False)])
    s = Store(path)
    try:
        assert s.con.execute("SELECT version FROM schema_info").fetchall() == [(SCHEMA_VERSION,)]
        assert s.con.execute("SELECT name, verdict, workload FROM canary_results ORDER BY name").fetchall() == [
            ("a", "pass", None),
            ("b", "fail", None),
        ]
        columns = s.con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'canary_results' ORDER BY column_index"
        ).fetchall()
        fresh = Store(tmp_path / "fresh" / "vigil.duckdb")
        try:
            same = fresh.con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = 'canary_results' ORDER BY column_index"
            ).fetchall()
        finally:
            fresh.close()
        assert columns == same, "a migrated file has the columns of a new one, in the same order"
    finally:
        s.close()
