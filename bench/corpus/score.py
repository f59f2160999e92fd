"""Score detector alerts on one recorded run against its manifest (pure: alerts and a run in, numbers out).

An *episode* is one incident of one detector on one rank (the alert updates sharing an
episode id; the ``anomalies`` table keeps one row per episode). Rules:

- An episode is *after the fault* when it opened at or after the fault step, or, for
  detectors that judge silence (their episode names the last step before it), when it
  opened at the step just before the fault no earlier than the fault's time.
- Before the fault (and anywhere in a clean run) every episode is false: a *false page*
  when it reached ``page`` at any point, else a *false warn*.
- After the fault, the first episode of an expected detector (on the fault's rank, when the
  fault has one) is the *detection*; latency is its opening step minus the fault step, and
  its opening time minus the fault's time. It is *in budget* when within the manifest's
  steps or seconds budget (either suffices). On a run that stays broken (``persistent``), a
  detection that later clears is reported (``cleared``): the all-clear was wrong.
- Other episodes after the fault are *collateral*: listed, never counted as false, because
  a run after a fault may rightly trip other detectors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from trainvigil.schemas import Anomaly

from .load import LiveAlert, Run

Update: TypeAlias = Anomaly | LiveAlert
"""An alert update: an ``Anomaly`` from replay, or a row of the live ``anomalies`` table."""


@dataclass(slots=True)
class Episode:
    detector: str
    rank: int
    step: int | None
    time: float
    page: bool
    cleared: bool

    def brief(self) -> str:
        return f"{self.detector}@{self.step}{'!' if self.page else ''}"


@dataclass(frozen=True, slots=True)
class Catch:
    """An expected detector's first episode after the fault, and how late it came."""

    episode: Episode
    steps: int | None
    seconds: float
    in_budget: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.episode.step,
            "latency_steps": self.steps,
            "latency_s": round(self.seconds, 1),
            "in_budget": self.in_budget,
            "severity": "page" if self.episode.page else "warn",
            "cleared": self.episode.cleared,
        }


@dataclass(slots=True)
class RunScore:
    name: str
    fault: str
    fault_step: int | None
    expected: tuple[str, ...]
    clean_steps: int
    false_pages: list[Episode] = field(default_factory=list)
    false_warns: list[Episode] = field(default_factory=list)
    first: dict[str, Catch] = field(default_factory=dict)
    """Per expected detector that caught the fault: its first episode after it."""
    collateral: list[Episode] = field(default_factory=list)
    persistent: bool = False

    @property
    def detection(self) -> Catch | None:
        """The earliest catch by any expected detector."""
        return min(self.first.values(), key=lambda c: c.episode.time, default=None)

    def as_json(self) -> dict[str, Any]:
        c = self.detection
        d = None if c is None else c.episode
        return {
            "run": self.name,
            "fault": self.fault,
            "fault_step": self.fault_step,
            "expected": list(self.expected),
            "clean_steps": self.clean_steps,
            "detected_by": None if d is None else d.detector,
            "detected_step": None if d is None else d.step,
            "detected_severity": None if d is None else ("page" if d.page else "warn"),
            "latency_steps": None if c is None else c.steps,
            "latency_s": None if c is None else round(c.seconds, 1),
            "in_budget": c is not None and c.in_budget,
            "cleared": None if d is None or not self.persistent else d.cleared,
            "by_detector": {name: catch.as_json() for name, catch in self.first.items()},
            "false_pages": [e.brief() for e in self.false_pages],
            "false_warns": [e.brief() for e in self.false_warns],
            "collateral": [e.brief() for e in self.collateral],
        }


def episodes(updates: Iterable[Update]) -> list[Episode]:
    """Alert updates folded into episodes, in the order they opened."""
    found: dict[object, Episode] = {}
    for n, u in enumerate(updates):
        key: object = u.episode if u.episode else ("one-off", n)
        ep = found.get(key)
        if ep is None:
            ep = found[key] = Episode(u.detector, u.rank, u.step, u.time, False, False)
        ep.page |= u.severity == "page"
        ep.cleared |= u.state == "cleared"
    return list(found.values())


def _after(ep: Episode, step: int, time: float) -> bool:
    if ep.step is None:
        return ep.time >= time
    return ep.step >= step or (ep.step == step - 1 and ep.time >= time)


def _catch(run: Run, ep: Episode, step: int, time: float) -> Catch:
    steps = None if ep.step is None else ep.step - step
    seconds = ep.time - time
    by_steps = run.budget_steps is not None and steps is not None and steps <= run.budget_steps
    by_time = run.budget_s is not None and seconds <= run.budget_s
    return Catch(ep, steps, seconds, by_steps or by_time)


def score(run: Run, updates: Sequence[Update]) -> RunScore:
    """The run's false alarms before its fault, and how its fault was caught."""
    fault = run.fault
    result = RunScore(
        run.name,
        fault.kind if fault else "none",
        fault.step if fault else None,
        run.expected,
        run.clean_steps(),
        persistent=bool(run.manifest.get("persistent")),
    )
    for ep in episodes(updates):
        if fault is None or not _after(ep, fault.step, fault.time):
            (result.false_pages if ep.page else result.false_warns).append(ep)
        elif (
            ep.detector in run.expected
            and ep.detector not in result.first
            and (fault.rank is None or ep.rank == fault.rank)
        ):
            result.first[ep.detector] = _catch(run, ep, fault.step, fault.time)
        else:
            result.collateral.append(ep)
    return result
