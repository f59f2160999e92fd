"""The RL canary's own faults, ``kl_explode`` and ``reward_hack``, taken from the armed ``VIGIL_FAULT`` plan.

Both act on the real learning, never on the logged numbers, and each is a ``fault_injected``
event through the plan, like the hooks ``watch()`` installs:

* ``kl_explode``: from update K the policy's learning rate is ``KL_LR_FACTOR`` x its schedule (the
  critic's is left alone): each update moves the policy far from the one that collected the
  rollout, so the approximate KL explodes within a few updates;
* ``reward_hack``: from update K the training reward also pays ``STAY_BONUS`` for every ``stay``, a
  flawed reward model that likes the no-op; a policy that collapses onto ``stay`` earns more than
  the task ever paid, its entropy falls to nothing and the held-out ``true_return`` falls to 0.
"""

from __future__ import annotations

from typing import Any

from trainvigil.agents.faults import Fault, FaultPlan

KL_LR_FACTOR = 50.0
STAY_BONUS = 0.5
"""Per ``stay``: staying for all 16 moves of an episode pays 8, the task at most 1."""


class RlFaults:
    """What the plan asks of the learner at each update (nothing without a plan)."""

    def __init__(self, plan: FaultPlan | None) -> None:
        self._plan = plan
        self._kl = plan.get("kl_explode") if plan else None
        self._hack = plan.get("reward_hack") if plan else None

    def _active(self, fault: Fault | None, step: int, **detail: Any) -> bool:
        """Whether ``fault`` is on at ``step``; the first such step is its ``fault_injected`` event."""
        if fault is None or self._plan is None or step < fault.step:
            return False
        if self._plan.due(fault, step):
            self._plan.fired(fault, step, **detail)
        return True

    def lr_factor(self, step: int) -> float:
        """The policy LR's multiplier at ``step``."""
        return KL_LR_FACTOR if self._active(self._kl, step, factor=KL_LR_FACTOR, group="policy") else 1.0

    def stay_bonus(self, step: int) -> float:
        """What the training reward pays per ``stay`` at ``step``."""
        return STAY_BONUS if self._active(self._hack, step, bonus=STAY_BONUS, action="stay") else 0.0
