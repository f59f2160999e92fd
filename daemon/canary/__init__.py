"""Fault-injection canaries: small real training jobs the daemon runs, breaks on purpose, and judges.

They prove, continuously, that the whole chain (agent → NATS → daemon → detectors → alerts) still
catches what it exists to catch. The stage (:mod:`.service`) runs the schedule and answers
``vigil canary run``; :mod:`.runner` takes one canary from launch to verdict; :mod:`.verdict` is the
pure rule, :mod:`.evidence` what it reads from the store, :mod:`.catalog` what runs and what must
catch it. The workloads (``trainvigil.canary``) import the agent, so they are only ever started as
processes (:mod:`.process`), never imported here.
"""

from .catalog import EXPECTED, Budget, CanaryPlanError, Plan, budget, plan
from .service import Canaries
from .verdict import Alert, Ending, Evidence, Injection, Verdict, judge

__all__ = [
    "EXPECTED",
    "Alert",
    "Budget",
    "Canaries",
    "CanaryPlanError",
    "Ending",
    "Evidence",
    "Injection",
    "Plan",
    "Verdict",
    "budget",
    "judge",
    "plan",
]
