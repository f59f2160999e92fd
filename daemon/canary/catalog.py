"""What a canary runs and what it expects: its command line, the detector its fault must trip, and by when.

The workloads themselves live in ``trainvigil.canary``, which imports the agent, so the daemon
never imports them: it runs them as ``python -P -m <module>`` from the shared table in
:mod:`trainvigil.schemas.canaries`, each in a private directory of its own (see :class:`Job`). ``-m``
alone would put the working directory first on the job's import path, so a ``torch.py`` left in the
daemon's would run at every canary. ``-P`` drops exactly that entry; ``-I`` would also drop what the
operator set on purpose (``PYTHONPATH`` for an install that needs it, the user's site-packages of a
``pip install --user``, ``PYTHONUNBUFFERED`` that keeps the job's log current), all of which are the
daemon's own environment, trusted as the daemon is. The deadlines are the ones the detector evaluation
(``bench/detectors_eval.py``) holds the detectors to, read from this daemon's own detector
settings where a setting decides them (a slower ``slowdown`` window gets a later deadline).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainvigil.daemon.config import CanaryConfig, DaemonConfig
from trainvigil.schemas.canaries import CLEAN, FAULT_KINDS, FAULTS, WORKLOADS

EXPECTED: dict[str, str] = {k.name: k.detector for k in FAULTS.values()}
"""The detector each fault kind must trip (:attr:`~trainvigil.schemas.canaries.FaultKind.detector`)."""

ALSO: dict[str, frozenset[str]] = {"straggler": frozenset({"slowdown"})}
"""Detectors that may rightly page on a fault besides the expected one (as in the detector evaluation:
a straggling rank is also slower than it was)."""
HANGS = frozenset({"stall", "gil"})
"""Faults after which the job never ends by itself (``stall``) or crawls (``gil``: three busy threads take
the GIL from the training loop, which then makes a step or two a second): the runner stops it once judged."""
TIMED = frozenset({"stall", "gil"})
"""Faults judged in time, not steps: their detectors report where training was (a stall's page carries
the last step completed, before the fault's step; GIL contention is sampled per second, not per step)."""

HEARTBEAT_S = 5.0
"""The agent's default heartbeat interval: ``hang`` judges a stopped loop when a heartbeat arrives."""
GIL_PERIOD_S = 1.0
"""The agent's default GIL sampling period."""


@dataclass(frozen=True, slots=True)
class Budget:
    """How late a detection may be: in steps, in seconds, or either (late only once past every budget given)."""

    steps: int | None = None
    seconds: float | None = None

    def within(self, steps: int | None, seconds: float | None) -> bool:
        checks = []
        if self.steps is not None and steps is not None:
            checks.append(steps <= self.steps)
        if self.seconds is not None and seconds is not None:
            checks.append(seconds <= self.seconds)
        return any(checks) or not checks

    def __str__(self) -> str:
        parts = [f"{self.steps} steps" if self.steps is not None else "", f"{self.seconds:g} s" if self.seconds else ""]
        return " or ".join(p for p in parts if p) or "none"


def budget(fault: str, detectors: Any) -> Budget:
    """The deadline of ``fault``'s detection, after the step it was injected at.

    ``detectors`` is the daemon's ``DetectorsConfig``. Non-finite values page at their step, a
    corrupt checkpoint at its load (the step it was saved at), a grad spike within a step, KL
    within 20 and reward hacking within 150; a slowdown or straggler within two of its detector's
    windows; a stalled loop within ``hang``'s silence plus two heartbeats; GIL contention within its
    run of contended periods plus three.
    """
    if fault in ("nan_grad", "ckpt_corrupt"):
        return Budget(steps=0)
    if fault == "grad_spike":
        return Budget(steps=1)
    if fault in ("lr_spike", "kl_explode"):
        return Budget(steps=20)
    if fault == "reward_hack":
        return Budget(steps=150)
    if fault in ("slowdown", "straggler"):
        window = getattr(detectors, EXPECTED[fault])
        return Budget(steps=2 * window.min_steps, seconds=2 * window.min_seconds)
    if fault == "stall":
        return Budget(seconds=detectors.hang.min_seconds + 2 * HEARTBEAT_S)
    if fault == "gil":
        return Budget(seconds=(detectors.gil_contention.consecutive + 3) * GIL_PERIOD_S)
    return Budget()


@dataclass(frozen=True, slots=True)
class Job:
    """Something a canary can run: a built-in workload or a ``[[canary.jobs]]`` entry."""

    name: str
    argv: tuple[str, ...]
    faults: tuple[str, ...]
    fault_step: int
    takes_steps: bool
    """A workload takes ``--steps``; a job's own command line is left as written."""
    cwd: str | None = None
    """Where a configured job runs (``None``: where the daemon runs, which its command line may name files in)."""
    env: Mapping[str, str] = field(default_factory=dict)
    private: bool = False
    """Runs in a fresh directory of its own (mode 0700, removed once it ended), ``cwd`` unused: the built-in
    workloads, which read nothing from where they run."""


def _interpreter(argv: list[str]) -> list[str]:
    """A leading bare ``python`` is the daemon's own interpreter, so the job sees the trainvigil it runs with."""
    if argv and argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return argv


def jobs(config: CanaryConfig) -> dict[str, Job]:
    """Every job by name: each built-in workload, then the configured ones."""
    out = {
        w.name: Job(
            w.name, (sys.executable, "-P", "-m", w.module), w.faults, w.fault_step, takes_steps=True, private=True
        )
        for w in WORKLOADS.values()
    }
    for j in config.jobs:
        argv = tuple(_interpreter(shlex.split(j.command)))
        out[j.name] = Job(j.name, argv, j.fault_kinds, j.fault_step, takes_steps=False, cwd=j.cwd or None, env=j.env)
    return out


class CanaryPlanError(ValueError):
    """A canary that cannot be run as asked (unknown fault or job, a fault the job does not take)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """One canary, decided: what runs, with which fault where, and what must catch it."""

    run_id: str
    job: Job
    fault: str
    fault_step: int | None
    expected: str
    budget: Budget
    argv: tuple[str, ...]

    @property
    def timed(self) -> bool:
        """Judged in time rather than steps (see :data:`TIMED`)."""
        return self.fault in TIMED

    @property
    def tolerated(self) -> frozenset[str]:
        """Other detectors that may page on this fault (see :data:`ALSO`)."""
        return ALSO.get(self.fault, frozenset())

    @property
    def fault_env(self) -> str:
        """``VIGIL_FAULT`` for the job: empty for a clean twin."""
        return "" if self.fault == CLEAN else f"{self.fault}@{self.fault_step}"

    def describe(self) -> str:
        what = f"{self.fault_env}, expects {self.expected} within {self.budget}"
        if self.fault == CLEAN:
            what = "clean twin"
        return f"{self.run_id} ({self.job.name}, {what})"


def plan(
    config: DaemonConfig,
    run_id: str,
    fault: str,
    job_name: str = "",
    steps: int | None = None,
    fault_step: int | None = None,
) -> Plan:
    """Decide one canary: ``job_name`` (empty: the first workload that takes ``fault``) with ``fault``.

    Raises:
        CanaryPlanError: an unknown fault kind or job, a fault the job does not take, ``steps`` for a
            job with its own command line.
    """
    if fault != CLEAN and fault not in FAULT_KINDS:
        raise CanaryPlanError(f"unknown fault kind {fault!r}; kinds: {', '.join(FAULT_KINDS)} (or {CLEAN})")
    known = jobs(config.canary)
    if not job_name:
        job_name = next((j.name for j in known.values() if fault == CLEAN or fault in j.faults), "")
    job = known.get(job_name)
    if job is None:
        raise CanaryPlanError(f"unknown workload or job {job_name!r}; known: {', '.join(known)}")
    if fault != CLEAN and fault not in job.faults:
        raise CanaryPlanError(f"{job.name} does not take {fault}; it takes {', '.join(job.faults)}")
    if steps is not None and not job.takes_steps:
        raise CanaryPlanError(f"{job.name} runs its own command line; --steps is for the built-in workloads")
    argv = job.argv + (("--steps", str(steps)) if steps is not None else ())
    at = None if fault == CLEAN else (job.fault_step if fault_step is None else fault_step)
    if at is not None and steps is not None and at >= steps:
        raise CanaryPlanError(f"the fault step {at} is past the run's {steps} steps; pass a smaller fault step")
    expected = "" if fault == CLEAN else EXPECTED[fault]
    return Plan(run_id, job, fault, at, expected, budget(fault, config.detectors), argv)
