"""The one table of fault kinds (``trainvigil.schemas.canaries.FAULTS``) and every view derived from it agree."""

from __future__ import annotations

import dataclasses

import pytest

import trainvigil.faults
from trainvigil.agents import faults
from trainvigil.daemon.canary import catalog
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.detectors import REGISTRY
from trainvigil.schemas import canaries
from trainvigil.schemas.canaries import CLEAN, FAULT_KINDS, FAULTS, SCRIPT_FAULTS, WORKLOAD_FAULTS, WORKLOADS

DETECTORS = {d.name for d in REGISTRY}


@pytest.mark.parametrize("kind", list(FAULTS.values()), ids=list(FAULTS))
def test_every_kind_has_every_field_filled_in(kind: canaries.FaultKind) -> None:
    """A name (its key), a detector the daemon runs, at least one workload that exists, and who applies it."""
    for field in dataclasses.fields(canaries.FaultKind):
        assert getattr(kind, field.name) not in ("", (), None), f"{kind.name}: {field.name} is empty"
    assert FAULTS[kind.name] is kind and kind.name != CLEAN
    assert kind.detector in DETECTORS, f"{kind.name}: no detector {kind.detector!r}"
    assert set(kind.workloads) <= set(WORKLOADS), f"{kind.name}: unknown workloads {kind.workloads}"
    assert type(kind.script) is bool


def test_the_kind_lists_are_the_table_split_by_who_applies_them() -> None:
    assert tuple(k.name for k in FAULTS.values() if k.script) == SCRIPT_FAULTS
    assert tuple(k.name for k in FAULTS.values() if not k.script) == WORKLOAD_FAULTS
    assert (*SCRIPT_FAULTS, *WORKLOAD_FAULTS) == FAULT_KINDS and set(FAULT_KINDS) == set(FAULTS)
    assert len(set(FAULT_KINDS)) == len(FAULT_KINDS)


def test_each_workload_takes_exactly_the_kinds_that_name_it() -> None:
    for workload in WORKLOADS.values():
        assert workload.faults == tuple(k.name for k in FAULTS.values() if workload.name in k.workloads)
    assert {k for w in WORKLOADS.values() for k in w.faults} == set(FAULT_KINDS)
    for kind in FAULTS.values():
        assert canaries.default_workload(kind.name).name in kind.workloads


def test_the_agent_refuses_in_scripts_exactly_the_kinds_only_a_workload_applies() -> None:
    assert faults.KINDS == SCRIPT_FAULTS
    assert faults.CANARY_KINDS == WORKLOAD_FAULTS


def test_the_daemon_expects_each_kinds_own_detector_and_judges_only_known_kinds() -> None:
    assert {k.name: k.detector for k in FAULTS.values()} == catalog.EXPECTED
    assert set(catalog.EXPECTED) == set(FAULT_KINDS)
    assert set(catalog.ALSO) | catalog.HANGS | catalog.TIMED <= set(FAULT_KINDS)
    assert all(also <= DETECTORS for also in catalog.ALSO.values())


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_every_kind_has_a_deadline_and_a_plan(kind: str) -> None:
    config = DaemonConfig()
    assert str(catalog.budget(kind, config.detectors)) != "none"
    planned = catalog.plan(config, "canary-x", kind)
    assert planned.expected == FAULTS[kind].detector and planned.job.name == FAULTS[kind].workloads[0]


def test_the_public_module_is_the_agent_packages_public_names() -> None:
    """``trainvigil.faults`` offers exactly ``trainvigil.agents.faults.__all__``, the very same objects."""
    assert sorted(trainvigil.faults.__all__) == sorted(faults.__all__)
    public = {n for n in vars(trainvigil.faults) if not n.startswith("_")}
    assert public == set(faults.__all__)
    for name in faults.__all__:
        assert getattr(trainvigil.faults, name) is getattr(faults, name)
