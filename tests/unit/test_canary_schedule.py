"""The canary schedule and its configuration: pure functions of the clock, the config and a seeded random source."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from trainvigil.daemon import config as config_mod
from trainvigil.daemon.canary.catalog import jobs
from trainvigil.daemon.canary.schedule import Every, draw, new_id, scheduled_jobs
from trainvigil.daemon.config import CanaryConfig, CanaryJob, parse_interval
from trainvigil.errors import ConfigError
from trainvigil.schemas.canaries import CLEAN, SCRIPT_FAULTS


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("text", "seconds"), [("30m", 1800.0), ("90s", 90.0), ("1.5h", 5400.0), ("7d", 604800.0), ("500ms", 0.5)]
)
def test_an_interval_reads_as_seconds(text: str, seconds: float) -> None:
    assert parse_interval(text) == seconds


def test_interval_ticks_count_from_the_start_and_never_fire_twice() -> None:
    every = Every("30m", start=1000.0)
    assert every.next_after(1000.0) == 2800.0
    assert every.next_after(2799.9) == 2800.0
    assert every.next_after(2800.0) == 4600.0, "strictly after: a tick is never run twice"


def test_a_cron_expression_ticks_on_its_minutes_in_utc() -> None:
    every = Every("*/30 * * * *", start=0.0)
    assert every.next_after(_at("2026-01-01T10:05:00")) == _at("2026-01-01T10:30:00")
    assert every.next_after(_at("2026-01-01T10:30:00")) == _at("2026-01-01T11:00:00")


def test_ticks_take_turns_over_the_workloads_then_the_jobs() -> None:
    cfg = CanaryConfig(workloads=["rl", "supervised"], jobs=[CanaryJob(name="mine", command="python t.py")])
    assert [j.name for j in scheduled_jobs(cfg, jobs(cfg))] == ["rl", "supervised", "mine"]


def test_a_tick_draws_a_fault_its_job_takes_and_the_config_allows_with_the_configured_probability() -> None:
    rng = random.Random(7)
    job = jobs(CanaryConfig())["supervised"]
    cfg = CanaryConfig(faults=["nan_grad", "kl_explode"], fault_probability=0.5)
    drawn = [draw(job, cfg, rng) for _ in range(2000)]
    assert set(drawn) == {"nan_grad", CLEAN}, "kl_explode is not the supervised workload's"
    assert 900 < drawn.count(CLEAN) < 1100
    assert {draw(job, CanaryConfig(fault_probability=0.0), rng) for _ in range(50)} == {CLEAN}
    assert {draw(job, CanaryConfig(fault_probability=1.0), rng) for _ in range(500)} == set(SCRIPT_FAULTS)


def test_run_ids_sort_by_start_and_differ() -> None:
    ids = {new_id() for _ in range(100)}
    assert len(ids) == 100 and all(len(i.split("-")) == 2 for i in ids)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"VIGIL_CANARY_EVERY": "sometimes"}, "canary.every (VIGIL_CANARY_EVERY) must be an interval like 30m"),
        ({"VIGIL_CANARY_FAULTS": "nan_gard"}, "canary.faults (VIGIL_CANARY_FAULTS) must be fault kinds among"),
        ({"VIGIL_CANARY_WORKLOADS": "supervised,cnn"}, "must be workloads among supervised, rl, two_rank, not 'cnn'"),
        ({"VIGIL_CANARY_FAULT_PROBABILITY": "1.5"}, "must be a number from 0 to 1"),
        ({"VIGIL_CANARY_NICE": "20"}, "must be a niceness from 0 to 19"),
    ],
)
def test_a_bad_canary_setting_is_a_config_error_naming_its_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_mod.load(env=env)


def test_jobs_need_unique_names_apart_from_the_workloads_and_script_faults_only() -> None:
    with pytest.raises(ValueError, match="jobs with unique names that are not workloads"):
        CanaryConfig(jobs=[CanaryJob(name="rl", command="python t.py")])
    with pytest.raises(ValueError, match=r"canary.jobs.faults .* must be fault kinds among nan_grad"):
        CanaryJob(name="mine", command="python t.py", faults=["kl_explode"])
    cfg = config_mod.load(env={"VIGIL_CANARY_FAULTS": "nan_grad, slowdown", "VIGIL_CANARY_EVERY": "0 3 * * *"})
    assert cfg.canary.fault_kinds == ("nan_grad", "slowdown") and cfg.canary.every == "0 3 * * *"
