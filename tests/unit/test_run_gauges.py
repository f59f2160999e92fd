"""The per-run training gauges of ``/metrics``: what they show, and the cardinality cap that bounds them."""

from __future__ import annotations

import math
import time
from typing import Literal

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch, StepColumns
from trainvigil.daemon.metrics import RUN_ENDED_S, DaemonMetrics, RunGauges
from trainvigil.schemas import Anomaly, RunEnd, Source


def _steps(run_id: str, first: int, n: int, t0: float, loss: float | None = None) -> StepColumns:
    steps = np.arange(first, first + n, dtype=np.int64)
    known: dict[str, tuple[np.ndarray, np.ndarray | None]] = {} if loss is None else {"loss": (np.full(n, loss), None)}
    return StepColumns(Source(run_id=run_id), steps, t0 + 0.1 * (steps - first), known, {})


def _alert(run_id: str, state: str, severity: Literal["warn", "page"] = "page") -> Anomaly:
    return Anomaly(time=1.0, run_id=run_id, rank=0, step=5, detector="non_finite", severity=severity, value=0.0,
                   message="m", state=state, episode="non_finite:1")  # fmt: skip


def test_a_run_shows_its_step_pace_loss_and_open_alerts() -> None:
    gauges, now = RunGauges(), time.time()
    gauges.observe(IngestBatch(steps=[_steps("a", 0, 10, 100.0, loss=2.0)], anomalies=[_alert("a", "open")]), now)
    gauges.observe(IngestBatch(steps=[_steps("a", 10, 10, 101.0, loss=math.nan)]), now)
    text = DaemonMetrics(runs=gauges).render()
    assert 'vigil_run_last_step{run_id="a"} 19.0' in text
    assert 'vigil_run_steps_per_second{run_id="a"} 10.0' in text  # 9 -> 19 over 100.9 -> 101.9 s of log time
    assert 'vigil_run_loss{run_id="a"} NaN' in text  # a NaN loss is the news, not a gap
    assert 'vigil_run_open_alerts{run_id="a",severity="page"} 1.0' in text
    gauges.observe(IngestBatch(anomalies=[_alert("a", "cleared")]), now)
    assert 'vigil_run_open_alerts{run_id="a",severity="page"} 0.0' in DaemonMetrics(runs=gauges).render()


def test_at_most_the_cap_of_runs_the_most_recently_active_and_ended_runs_age_out() -> None:
    gauges, now = RunGauges(most=3), time.time() - RUN_ENDED_S - 10
    for i in range(5):
        gauges.observe(IngestBatch(steps=[_steps(f"r{i}", 0, 2, 100.0)]), now + i)
    text = DaemonMetrics(runs=gauges).render()
    assert len(gauges) == 3 and 'run_id="r1"' not in text and 'run_id="r4"' in text
    assert "vigil_runs_exported 3.0" in text
    gauges.observe(IngestBatch(run_ends=[(Source(run_id="r4"), RunEnd(time=1.0, status="ok"))]), now + 5)
    gauges.observe(IngestBatch(steps=[_steps("r3", 2, 2, 100.0)]), now + 5 + RUN_ENDED_S + 1)
    assert len(gauges) == 2 and 'run_id="r4"' not in DaemonMetrics(runs=gauges).render()
