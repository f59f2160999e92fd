"""Fault injection for canary runs: ``VIGIL_FAULT=<kind>@<step>[,<kind>@<step>]`` breaks real training.

::

    VIGIL_FAULT=nan_grad@50 python train.py     # a NaN gradient at step 50: non_finite must page

A run broken on purpose (a NaN in a gradient, an LR spike, a stalled loop, a corrupt checkpoint...)
proves that the chain agent → daemon → detectors → alerts still catches it. Read by
``trainvigil.init()``; applied by ``trainvigil.torch.watch()`` and ``trainvigil.checkpoint.save``
(:mod:`.hooks`); every injection is a ``fault_injected`` event. Without the variable nothing is armed
(``armed()`` is ``None``). ``parse`` checks a plan without arming it (:mod:`.plan`).

:data:`__all__` is also the public ``trainvigil.faults``.
"""

from __future__ import annotations

from .plan import CANARY_KINDS, ENV, KINDS, Fault, FaultPlan, accept, armed, from_env, parse
from .plan import EventSink as EventSink
from .plan import arm as arm
from .plan import disarm as disarm

__all__ = ["CANARY_KINDS", "ENV", "KINDS", "Fault", "FaultPlan", "accept", "armed", "from_env", "parse"]
