"""The fault plan ``VIGIL_FAULT`` arms, read once by ``trainvigil.init()``: parsing, which faults fired, and
the ``fault_injected`` / ``fault_missed`` events that say so.

Nothing is armed without the variable: then :func:`armed` is ``None`` and ``watch()`` and
``checkpoint.save`` install nothing. A malformed value is a :class:`~trainvigil.errors.ConfigError` at
``init()``, never a silent no-op. :mod:`.hooks` applies the plan to the optimizer, the gradients and
the checkpoint file.

The kinds are those of :data:`trainvigil.schemas.canaries.FAULTS`. The workload-only ones (:data:`CANARY_KINDS`) make
sense only inside a canary workload (two ranks, the RL learner): a script is refused them unless it called
:func:`accept` before ``init()``, which is how ``trainvigil.canary``'s workloads say that they apply them.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from trainvigil.errors import ConfigError
from trainvigil.schemas.canaries import SCRIPT_FAULTS, WORKLOAD_FAULTS

log = logging.getLogger("trainvigil.faults")

ENV = "VIGIL_FAULT"
KINDS = SCRIPT_FAULTS
"""The kinds any script using ``trainvigil.torch.watch()`` / ``trainvigil.checkpoint.save`` can take."""
CANARY_KINDS = WORKLOAD_FAULTS
"""Kinds that need a canary workload (two ranks, the RL learner): refused in ordinary scripts."""
_STEP = re.compile(r"[0-9]+")
_accepted: tuple[str, ...] = ()
"""The workload-only kinds this process applies (:func:`accept`); none in an ordinary script."""


def accept(*kinds: str) -> None:
    """Let ``VIGIL_FAULT`` name the workload-only ``kinds`` in this process (none: refuse them all again).

    A canary workload calls it before ``trainvigil.init()`` for the kinds it applies itself
    (``rl``: ``kl_explode``, ``reward_hack``; a rank of ``two_rank``: ``straggler``); every other
    process keeps refusing them with a ``ConfigError`` saying that they need a canary workload.

    Raises:
        ValueError: a kind that is not one of :data:`CANARY_KINDS`.
    """
    global _accepted
    unknown = [k for k in kinds if k not in CANARY_KINDS]
    if unknown:
        raise ValueError(f"not workload-only fault kinds: {', '.join(unknown)} (those are {', '.join(CANARY_KINDS)})")
    _accepted = tuple(k for k in CANARY_KINDS if k in kinds)


def _valid() -> tuple[str, ...]:
    return (*KINDS, *_accepted)


@dataclass(frozen=True, slots=True)
class Fault:
    """One planned fault: ``kind`` injected at the first step at or after ``step``."""

    kind: str
    step: int

    def __str__(self) -> str:
        return f"{self.kind}@{self.step}"


def _bad(text: str, problem: str) -> ConfigError:
    usage = f"valid kinds: {', '.join(_valid())}; write {ENV}=<kind>@<step>[,<kind>@<step>], e.g. nan_grad@50"
    return ConfigError(f"{ENV}={text!r}: {problem}; {usage}", key=ENV)


def _fault(text: str, item: str) -> Fault:
    kind, at, step = (part.strip() for part in item.partition("@"))
    if not at:
        raise _bad(text, f"{item.strip()!r} is not <kind>@<step>" if item.strip() else "an empty item (a stray comma?)")
    if kind in CANARY_KINDS and kind not in _accepted:
        raise _bad(text, f"{kind!r} needs a canary workload (two ranks or the RL learner), not a training script")
    if kind not in _valid():
        close = difflib.get_close_matches(kind.lower(), _valid(), n=1)
        raise _bad(text, f"unknown kind {kind!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if not _STEP.fullmatch(step):
        raise _bad(text, f"{item.strip()!r}: the step must be a whole number >= 0")
    return Fault(kind, int(step))


def parse(text: str) -> tuple[Fault, ...]:
    """The faults in ``text`` (``VIGIL_FAULT``'s syntax), in the order given.

    Raises:
        ConfigError: an unknown kind, a missing or negative step, an empty item, or a kind given
            twice; one line naming the valid kinds.
    """
    faults = tuple(_fault(text, item) for item in text.split(","))
    kinds = [f.kind for f in faults]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if twice:
        raise _bad(text, f"{', '.join(twice)} given more than once (each kind at most once)")
    return faults


def from_env(env: Mapping[str, str] = os.environ) -> tuple[Fault, ...]:
    """The faults ``VIGIL_FAULT`` asks for; none when it is unset or empty (see :func:`parse`)."""
    text = env.get(ENV, "")
    return parse(text) if text != "" else ()


class EventSink(Protocol):
    """What the plan needs of an agent: events, and a hook called when it closes."""

    before_close: list[Callable[[], None]]

    def event(self, kind: str, /, step: int | None = None, **fields: Any) -> None: ...


class FaultPlan:
    """The armed faults of one agent: which fired, and the events that say so.

    ``released`` is set when the agent closes: a ``stall`` waits on it and the ``gil`` thread
    stops on it, so a test (or a canary runner) can end them by closing the agent.
    """

    def __init__(self, faults: tuple[Fault, ...], agent: EventSink) -> None:
        self.faults = faults
        self.released = threading.Event()
        self.last_step: int | None = None
        """The last step the training hooks saw (for the message when a fault never fired)."""
        self._agent = agent
        self._fired: set[Fault] = set()

    def get(self, kind: str) -> Fault | None:
        """The planned fault of ``kind``, if any (each kind is planned at most once)."""
        return next((f for f in self.faults if f.kind == kind), None)

    def due(self, fault: Fault, step: int | None) -> bool:
        """Whether ``fault`` has not fired yet and ``step`` has reached it."""
        return step is not None and step >= fault.step and fault not in self._fired

    def fired(self, fault: Fault, step: int | None, **detail: Any) -> None:
        """Record that ``fault`` was injected at ``step``: a ``fault_injected`` event and a log line."""
        self._fired.add(fault)
        self._agent.event("fault_injected", step=step, kind=fault.kind, planned_step=fault.step, **detail)
        shown = "".join(f" {k}={v}" for k, v in detail.items())
        log.warning("trainvigil: %s injected %s at step %s%s", ENV, fault.kind, step, shown)

    def close(self) -> None:
        """Release a stall and the GIL thread; every fault that never fired is a ``fault_missed``
        event and a warning (a plan that did nothing must not look like a clean run)."""
        self.released.set()
        for fault in self.faults:
            if fault in self._fired:
                continue
            if fault.kind == "ckpt_corrupt":
                why = f"no trainvigil.checkpoint.save(..., step=S) with S >= {fault.step}"
            elif self.last_step is None:
                why = "no trainvigil.torch.watch(model, optimizer) hooked an optimizer step"
            else:
                why = f"the watched training stopped at step {self.last_step}"
            self._agent.event("fault_missed", step=self.last_step, kind=fault.kind, planned_step=fault.step, why=why)
            log.warning("trainvigil: %s=%s was never injected: %s", ENV, fault, why)
        disarm(self)


_armed: FaultPlan | None = None


def arm(faults: tuple[Fault, ...], agent: EventSink) -> FaultPlan | None:
    """Arm ``faults`` for ``agent`` (called by ``init()``); with none, nothing is armed."""
    global _armed
    if not faults:
        _armed = None
        return None
    plan = _armed = FaultPlan(faults, agent)
    agent.before_close.append(plan.close)
    log.warning("trainvigil: %s=%s armed: this run is broken on purpose", ENV, ",".join(map(str, faults)))
    return plan


def armed() -> FaultPlan | None:
    """The plan the last ``init()`` armed, until its agent closes; ``None`` without ``VIGIL_FAULT``."""
    return _armed


def disarm(plan: FaultPlan) -> None:
    """Forget ``plan`` if it is the armed one."""
    global _armed
    if _armed is plan:
        _armed = None
