"""The canary contract: which workloads exist and what faults they take, and the trigger on the wire.

The daemon launches canaries as subprocesses and may not import the workloads (they import the
agent), and the workloads may not import the daemon: this table is what both sides agree on,
so it lives here, where both may import it. ``python -m <module> [--steps N] [--seed S]`` runs a
workload; ``VIGIL_FAULT=<kind>@<step>`` breaks it. Each fault kind is one row of :data:`FAULTS`; the kind
lists, each workload's faults and the daemon's expected detectors are read from it.

``vigil canary run`` asks a running daemon for a canary with a :class:`CanaryRequest` on
:attr:`~.subjects.Subjects.canary` (``vigil.v1.ctl.canary``, request/reply, the daemon's credentials); the
daemon answers with a :class:`CanaryAccepted` at once, runs the job when a slot is free, and publishes its
:class:`~.records.CanaryResult` on the run's alert subject (``vigil.v1.alerts.<run>``), where the
``canary_failed`` alert of a failed one goes too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import msgspec

CLEAN = "none"
"""The ``fault`` of a clean twin: the same job with nothing injected."""


@dataclass(frozen=True, slots=True)
class FaultKind:
    """One ``VIGIL_FAULT`` kind: who applies it, which workloads take it, and what must catch it.

    Attributes:
        name: what ``VIGIL_FAULT`` names (``<name>@<step>``).
        detector: the detector a canary with this fault expects to page (``EXPECTED`` of the daemon's catalog).
        workloads: the canary workloads that take it, by name (:data:`WORKLOADS`).
        script: any script using ``trainvigil.torch.watch()`` / ``trainvigil.checkpoint.save`` takes it;
            ``False``: only a canary workload applies it, and the agent refuses it in any other process.
    """

    name: str
    detector: str
    workloads: tuple[str, ...]
    script: bool


FAULTS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind("nan_grad", "non_finite", ("supervised",), script=True),
        FaultKind("grad_spike", "grad_spike", ("supervised",), script=True),
        FaultKind("lr_spike", "loss_spike", ("supervised",), script=True),
        FaultKind("slowdown", "slowdown", ("supervised",), script=True),
        # The loop blocks while heartbeats go on: a live process that stopped stepping is ``hang``'s case
        # (``stall`` is for a rank that went silent).
        FaultKind("stall", "hang", ("supervised",), script=True),
        FaultKind("ckpt_corrupt", "ckpt_mismatch", ("supervised",), script=True),
        FaultKind("gil", "gil_contention", ("supervised",), script=True),
        FaultKind("straggler", "straggler", ("two_rank",), script=False),
        FaultKind("kl_explode", "kl_explode", ("rl",), script=False),
        FaultKind("reward_hack", "reward_hack", ("rl",), script=False),
    )
}
"""Every fault kind, once: the agent's kinds (``trainvigil.faults``) and the daemon's expectations
(``trainvigil.daemon.canary.catalog``) are read from here."""
SCRIPT_FAULTS: tuple[str, ...] = tuple(k.name for k in FAULTS.values() if k.script)
"""Kinds any script using ``trainvigil.torch.watch()`` takes (``trainvigil.faults.KINDS``)."""
WORKLOAD_FAULTS: tuple[str, ...] = tuple(k.name for k in FAULTS.values() if not k.script)
"""Kinds only a canary workload applies (``trainvigil.faults.CANARY_KINDS``)."""
FAULT_KINDS: tuple[str, ...] = (*SCRIPT_FAULTS, *WORKLOAD_FAULTS)


@dataclass(frozen=True, slots=True)
class Workload:
    """One canary workload shipped in ``trainvigil.canary``.

    Attributes:
        name: also the module's last part: ``python -m trainvigil.canary.<name>``.
        module: the module to run with ``python -m``.
        steps: its default ``--steps`` (about 30-60 s alone on two CPU cores).
        faults: the ``VIGIL_FAULT`` kinds it applies: those of :data:`FAULTS` that name it.
        fault_step: where a fault goes by default: late enough for every detector's baseline,
            early enough for the slowest detector's deadline to fit in the run.
    """

    name: str
    module: str
    steps: int
    faults: tuple[str, ...]
    fault_step: int


def _workload(name: str, steps: int, fault_step: int) -> Workload:
    faults = tuple(k.name for k in FAULTS.values() if name in k.workloads)
    return Workload(name, f"trainvigil.canary.{name}", steps, faults, fault_step)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        _workload("supervised", 4_500, 1_600),
        _workload("rl", 3_000, 200),
        _workload("two_rank", 4_500, 300),
    )
}
"""The workloads by name, in the order a fault's default workload is looked for."""


def default_workload(fault: str) -> Workload:
    """The first workload that takes ``fault`` (a clean twin: the first one).

    Raises:
        KeyError: no workload takes ``fault``.
    """
    for workload in WORKLOADS.values():
        if fault == CLEAN or fault in workload.faults:
            return workload
    raise KeyError(fault)


RunToken = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class CanaryRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Run one canary now.

    Attributes:
        id: the caller's id; the run is ``canary-<id>`` (so the caller can follow it before it starts).
        fault: a kind of :data:`FAULT_KINDS`, or :data:`CLEAN`.
        workload: a workload of :data:`WORKLOADS` or a job of the daemon's ``[[canary.jobs]]``;
            empty: the first workload that takes ``fault``.
        steps: ``--steps`` for a workload (``None``: its default).
        fault_step: where the fault goes (``None``: the workload's or job's default).
    """

    id: RunToken
    fault: str = CLEAN
    workload: str = ""
    steps: Annotated[int, msgspec.Meta(ge=1)] | None = None
    fault_step: Annotated[int, msgspec.Meta(ge=0)] | None = None


class CanaryAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """The daemon's answer to a :class:`CanaryRequest`: what it will run, or why not (``error``)."""

    run_id: str = ""
    workload: str = ""
    fault: str = CLEAN
    fault_step: int | None = None
    expected_detector: str = ""
    error: str = ""


__all__ = [
    "CLEAN",
    "FAULTS",
    "FAULT_KINDS",
    "SCRIPT_FAULTS",
    "WORKLOADS",
    "WORKLOAD_FAULTS",
    "CanaryAccepted",
    "CanaryRequest",
    "FaultKind",
    "Workload",
    "default_workload",
]
