"""One canary from start to verdict: launch the job, watch it, let its data settle, judge, record, tell.

The job runs as its own process group (:mod:`.process`); past ``canary.timeout_s`` the group is
killed and the canary is an ``error``. A faulted job is watched while it runs. Once its detection is
settled (the expected detector fired, or an alert came before the fault) the rest of the run can only
add other detectors' pages on the fault, so it is stopped ``linger_s`` later (unless
``stop_when_caught`` is off). A job whose fault never lets it end (``stall``, ``gil``) is also stopped
once its deadline passed. A job that ends by itself is judged once every rank's ``run_end`` is stored
(at most ``settle_s`` later). The runner reads the run's alerts and ``fault_injected`` event
(:mod:`.evidence`), judges (:mod:`.verdict`), and writes the verdict with its ``canary_failed`` alert
in one transaction. The alert then goes out like any other (NATS, log, ``/metrics``, webhook) and the
:class:`~trainvigil.schemas.CanaryResult` is published on the run's alert subject.

A daemon shutting down cancels the runner: the group is killed and the canary recorded ``aborted``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import nats.errors
import structlog
from anyio.abc import Process
from nats.aio.client import Client as NATS

from trainvigil.daemon.alerts.fanout import Alerts
from trainvigil.daemon.canary import evidence as ev
from trainvigil.daemon.canary.catalog import HANGS, Plan
from trainvigil.daemon.canary.environment import base_env, job_env
from trainvigil.daemon.canary.process import last_line, prune, start, stop, working_directory
from trainvigil.daemon.canary.verdict import Ending, Evidence, Verdict, judge, settled
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.daemon.store.writer import Store
from trainvigil.errors import StoreUnavailableError
from trainvigil.schemas import Anomaly, CanaryResult, Envelope, Source, encode

log = structlog.get_logger("trainvigil.canary")

POLL_S = 0.25
"""How often the store is asked whether a job's data is in once it ended."""
WATCH_S = 1.0
"""How often the store is asked, while a faulted job runs, whether its detection is settled."""
HANG_MARGIN_S = 10.0
"""A job that cannot end is stopped this long after its deadline at the latest (a late detection is still seen late)."""

T = TypeVar("T")


def result_of(plan: Plan, verdict: Verdict, ending: Ending, duration_s: float) -> CanaryResult:
    """The ``canary_results`` row of one canary."""
    fired = verdict.fired
    return CanaryResult(
        time=time.time(),
        name=plan.run_id,
        fault=plan.fault,
        passed=verdict.outcome == "pass",
        expected_detector=plan.expected,
        fault_step=verdict.fault_step,
        fired_step=None if fired is None else fired.step,
        latency_steps=verdict.latency_steps,
        detail=verdict.detail,
        workload=plan.job.name,
        verdict=verdict.outcome,
        fired_detector="" if fired is None else fired.detector,
        latency_s=verdict.latency_s,
        exit_code=ending.exit_code,
        duration_s=round(duration_s, 3),
    )


def failed_alert(plan: Plan, result: CanaryResult, log_path: Path) -> Anomaly | None:
    """The ``canary_failed`` alert of a canary that did not pass: a page when the detectors missed or
    raised a false alarm, a warning when the job itself could not run; ``None`` otherwise."""
    if result.verdict not in ("fail", "error"):
        return None
    what = "a clean twin" if not plan.expected else f"{plan.fault_env}"
    if result.verdict == "error":
        regressed = "the canary job could not run, so nothing was proved"
    elif not plan.expected:
        regressed = f"false alarm: {result.fired_detector or 'a detector'} raised an alert on a clean run"
    else:
        regressed = f"{plan.expected} no longer catches {plan.fault} in time (or the chain to it is broken)"
    return Anomaly(
        time=result.time,
        run_id=plan.run_id,
        rank=0,
        step=result.fault_step,
        detector=ev.CANARY_ALERT,
        severity="page" if result.verdict == "fail" else "warn",
        value=result.latency_s,
        message=f"canary {plan.run_id} ({plan.job.name}, {what}) {result.verdict}: {regressed}. {result.detail}. "
        f"Its output: {log_path}; past verdicts: vigil canary list",
        episode=f"{ev.CANARY_ALERT}:{plan.run_id}",
    )


class Runner:
    """Runs canaries for one daemon (see the module's docstring)."""

    def __init__(
        self, nc: NATS, store: Store, config: DaemonConfig, metrics: DaemonMetrics, alerts: Alerts, nats_url: str
    ) -> None:
        self.nc, self.store, self.config, self.metrics, self.alerts = nc, store, config, metrics, alerts
        self.log_dir = Path(config.data_dir) / "canary"
        self.env = base_env(config, nats_url)

    async def read(self, query: Callable[..., T], *args: Any) -> T:
        """``query(cursor, *args)`` on a cursor of its own, on a worker thread."""

        def call() -> T:
            with self.store.cursor() as con:
                return query(con, *args)

        return await anyio.to_thread.run_sync(call)

    async def run(self, plan: Plan) -> CanaryResult:
        """Run ``plan`` to its verdict and record it; on cancellation, kill the job and record ``aborted``."""
        log_path = self.log_dir / f"{plan.run_id}.log"
        began = time.monotonic()
        log.info("canary_started", run_id=plan.run_id, job=plan.job.name, fault=plan.fault_env or "none",
                 expected=plan.expected, log=str(log_path))  # fmt: skip
        self.metrics.canaries_running += 1
        try:
            ending, evidence = await self._execute(plan, log_path)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self.record(plan, Ending(None, aborted=True), Evidence(), time.monotonic() - began, log_path)
            raise
        except Exception as exc:  # the store or the log could not be read: still a verdict, never a crash
            log.exception("canary_watch_failed", run_id=plan.run_id)
            failed = f"the canary runner failed ({exc!r}); see the daemon's log"
            ending, evidence = Ending(None, last_line=failed), Evidence()
        finally:
            self.metrics.canaries_running -= 1
        return await self.record(plan, ending, evidence, time.monotonic() - began, log_path)

    async def _execute(self, plan: Plan, log_path: Path) -> tuple[Ending, Evidence]:
        with working_directory(plan.job.cwd, private=plan.job.private) as cwd:
            return await self._run_job(plan, log_path, cwd)

    async def _run_job(self, plan: Plan, log_path: Path, cwd: str | None) -> tuple[Ending, Evidence]:
        env = job_env(self.env, plan.run_id, plan.fault_env, plan.job.env)
        try:
            process = await start(plan.argv, env=env, cwd=cwd, nice=self.config.canary.nice, log_path=log_path)
        except OSError as exc:
            return Ending(None, last_line=f"cannot start {plan.argv[0]}: {exc}"), Evidence()
        log.info("canary_process", run_id=plan.run_id, pid=process.pid, argv=list(plan.argv))
        evidence: Evidence | None = None
        stopped = timed_out = False
        try:
            with anyio.move_on_after(self.config.canary.timeout_s) as deadline:
                if plan.fault in HANGS or (plan.expected and self.config.canary.stop_when_caught):
                    evidence = await self._until_caught(plan, process)
                    stopped = evidence is not None
                if evidence is None:
                    await process.wait()
            timed_out = deadline.cancelled_caught
        finally:
            code = await stop(process)
        ending = Ending(code, timed_out=timed_out, stopped=stopped, last_line=last_line(log_path))
        if evidence is None and not timed_out and code == 0:
            evidence = await self._settled(plan)
        return ending, evidence or Evidence()

    async def _until_caught(self, plan: Plan, process: Process) -> Evidence | None:
        """The evidence ``linger_s`` after the detection is settled, or, for a job that cannot end by itself,
        once its deadline passed (the job is then stopped); ``None`` if the job ended on its own first."""
        grace = (plan.budget.seconds or 0.0) + HANG_MARGIN_S if plan.fault in HANGS else math.inf
        settled_at = math.inf
        while process.returncode is None:
            seen = await self.read(ev.gather, plan.run_id, plan.fault)
            if settled_at == math.inf and settled(plan, seen):
                settled_at = time.monotonic()
                log.info("canary_settled", run_id=plan.run_id, linger_s=self.config.canary.linger_s)
            lingered = time.monotonic() >= settled_at + self.config.canary.linger_s
            if seen.injected is not None and (lingered or time.time() > seen.injected.time + grace):
                return seen
            with anyio.move_on_after(WATCH_S):
                await process.wait()
        return None

    async def _settled(self, plan: Plan) -> Evidence:
        """The evidence once every rank's ``run_end`` is stored, or ``settle_s`` passed (said in it)."""
        with anyio.move_on_after(self.config.canary.settle_s):
            while not await self.read(ev.ended, plan.run_id):
                await anyio.sleep(POLL_S)
        return await self.read(ev.gather, plan.run_id, plan.fault)

    async def record(
        self, plan: Plan, ending: Ending, evidence: Evidence, duration_s: float, log_path: Path
    ) -> CanaryResult:
        """Judge, store the verdict with its alert, count it, log it, and send both out."""
        verdict = judge(plan, evidence, ending)
        result = result_of(plan, verdict, ending, duration_s)
        alert = failed_alert(plan, result, log_path)
        alerts = [alert] if alert is not None else []
        try:
            await anyio.to_thread.run_sync(self.store.record_canary, result, alerts)
        except StoreUnavailableError as exc:
            log.error("canary_unrecorded", run_id=plan.run_id, error=str(exc))
        self.metrics.canary_judged(plan.fault, verdict.outcome, result.time)
        level = log.info if verdict.outcome in ("pass", "aborted") else log.warning
        level("canary_verdict", run_id=plan.run_id, job=plan.job.name, fault=plan.fault, verdict=verdict.outcome,
              detail=verdict.detail, latency_steps=verdict.latency_steps, latency_s=verdict.latency_s,
              exit_code=ending.exit_code, duration_s=result.duration_s)  # fmt: skip
        await self.alerts.publish(alerts)
        envelope = Envelope(source=Source(run_id=plan.run_id), records=[result])
        try:
            await self.nc.publish(self.config.subjects.alert(plan.run_id), encode(envelope))
        except nats.errors.Error as exc:  # closed on shutdown: the verdict is stored all the same
            log.debug("canary_result_unpublished", run_id=plan.run_id, error=repr(exc))
        prune(self.log_dir, self.config.canary.keep_logs)
        return result
