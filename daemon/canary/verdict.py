"""A canary's verdict from what its run left in the store and how its job ended: plain data in, plain data out.

A faulted canary passes when the expected detector raised an episode at or after the step the
fault was injected at (for the faults judged in time, at or after the moment), within the fault's
deadline, nothing raised an alert before that, and no other detector paged (but those the detector
evaluation also expects on that fault: a straggler may page ``slowdown`` too). A clean twin passes
when nothing raised an alert at all. A job that crashed, timed out or never injected its fault is
an ``error`` (the canary proved nothing either way); one the daemon stopped on shutdown is ``aborted``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from trainvigil.daemon.canary.catalog import Plan
from trainvigil.schemas.canaries import CLEAN

Outcome = Literal["pass", "fail", "error", "aborted"]


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert episode of the canary's run (a row of ``anomalies``)."""

    detector: str
    severity: str
    step: int | None
    time: float
    rank: int = 0

    def __str__(self) -> str:
        where = f"step {self.step}" if self.step is not None else "no step"
        return f"{self.detector} {self.severity} at {where} (rank {self.rank})"


@dataclass(frozen=True, slots=True)
class Injection:
    """The job's ``fault_injected`` event: where the fault really went in."""

    step: int
    time: float


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the store holds about one canary run when it is judged."""

    alerts: tuple[Alert, ...] = ()
    injected: Injection | None = None
    missed: str = ""
    """Why its ``fault_missed`` event says the fault never went in ("" when there is none)."""
    settled: bool = True
    """Every rank's ``run_end`` was stored before judging (else the job's last data may be missing)."""


@dataclass(frozen=True, slots=True)
class Ending:
    """How the job ended."""

    exit_code: int | None
    timed_out: bool = False
    aborted: bool = False
    stopped: bool = False
    """The runner stopped it on purpose once judged (a fault that never lets the job end)."""
    last_line: str = ""
    """The last line of its output, for an error's detail."""


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    detail: str
    fault_step: int | None = None
    fired: Alert | None = None
    latency_steps: int | None = None
    latency_s: float | None = None


def _listed(alerts: Iterable[Alert], most: int = 3) -> str:
    items = list(alerts)
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return "; ".join(str(a) for a in items[:most]) + more


def _before(alert: Alert, injected: Injection, timed: bool) -> bool:
    if alert.step is not None and not timed:
        return alert.step < injected.step
    return alert.time < injected.time


def _order(alert: Alert) -> tuple[float, float]:
    return (alert.time if alert.step is None else float(alert.step), alert.time)


def _failed_job(plan: Plan, evidence: Evidence, ending: Ending) -> Verdict | None:
    """``aborted`` or ``error`` when the job itself went wrong, else ``None``."""
    planned = plan.fault_step
    said = f": {ending.last_line}" if ending.last_line else ""
    if ending.aborted:
        return Verdict("aborted", f"the daemon stopped first{said or ': its job was killed'}", planned)
    if ending.timed_out:
        return Verdict("error", f"still running after timeout_s; its process group was killed{said}", planned)
    if ending.exit_code is None and not ending.stopped:
        return Verdict("error", f"the job could not start{said}", planned)
    if not ending.stopped and ending.exit_code != 0:
        return Verdict("error", f"the job exited with status {ending.exit_code}{said}", planned)
    if plan.fault != CLEAN and evidence.injected is None:
        why = evidence.missed or "no fault_injected event was stored (does the job call trainvigil.torch.watch()?)"
        return Verdict("error", f"the fault {plan.fault_env} was never injected: {why}", planned)
    return None


def settled(plan: Plan, evidence: Evidence) -> bool:
    """Whether more of the job can no longer change its detection: an alert came before the fault (a
    fail), or the expected detector fired at or after it. A clean twin is never settled before its end."""
    injected = evidence.injected
    if plan.fault == CLEAN or injected is None:
        return False
    return any(_before(a, injected, plan.timed) or a.detector == plan.expected for a in evidence.alerts)


def judge(plan: Plan, evidence: Evidence, ending: Ending) -> Verdict:
    """The verdict of one canary (see the module's docstring for the rules)."""
    failed = _failed_job(plan, evidence, ending)
    if failed is not None:
        return failed
    verdict = _by_alerts(plan, evidence)
    if ending.stopped:
        return replace(verdict, detail=f"{verdict.detail}; its job was stopped once judged")
    return verdict


def _by_alerts(plan: Plan, evidence: Evidence) -> Verdict:
    """The verdict of a job that ran and injected its fault (or is a clean twin), from its alerts."""
    alerts = sorted(evidence.alerts, key=_order)
    unsettled = "" if evidence.settled else " (not all of its data was stored within settle_s)"
    if plan.fault == CLEAN:
        if alerts:
            return Verdict("fail", f"the clean twin raised alerts: {_listed(alerts)}", fired=alerts[0])
        return Verdict("pass", f"no alert on the clean twin{unsettled}")
    injected = evidence.injected
    assert injected is not None  # _failed_job
    at = injected.step
    early = [a for a in alerts if _before(a, injected, plan.timed)]
    hits = [a for a in alerts if a.detector == plan.expected and not _before(a, injected, plan.timed)]
    if early:
        return Verdict("fail", f"alerts before the fault at step {at}: {_listed(early)}", at, early[0])
    if not hits:
        instead = f"; raised instead: {_listed(alerts)}" if alerts else ""
        detail = f"{plan.expected} raised nothing after the fault at step {at}{instead}{unsettled}"
        return Verdict("fail", detail, at, alerts[0] if alerts else None)
    first = hits[0]
    steps = None if first.step is None or plan.timed else first.step - at
    seconds = max(0.0, first.time - injected.time)
    late_by = f"{seconds:.1f} s" if steps is None else f"+{steps} steps and {seconds:.1f} s"
    caught = f"{first}, {late_by} after the fault at step {at} (deadline {plan.budget})"
    verdict = Verdict("pass", caught, at, first, steps, seconds)
    if not plan.budget.within(steps, seconds):
        return Verdict("fail", f"late: {caught}", at, first, steps, seconds)
    others = [a for a in alerts if a.detector not in (plan.expected, *plan.tolerated) and a.severity == "page"]
    if others:
        return Verdict("fail", f"other detectors paged: {_listed(others)}; {caught}", at, first, steps, seconds)
    return verdict
