"""Fault injection for canary runs: ``VIGIL_FAULT=<kind>@<step>[,<kind>@<step>]`` breaks real training.

::

    VIGIL_FAULT=nan_grad@50 python train.py     # a NaN gradient at step 50: non_finite must page

Read by ``trainvigil.init()``; applied by ``trainvigil.torch.watch()`` and
``trainvigil.checkpoint.save``; every injection is a ``fault_injected`` event. Without the
variable nothing is armed (``armed()`` is ``None``). ``parse`` checks a plan without arming it.
"""

from __future__ import annotations

from trainvigil.agents.faults import CANARY_KINDS, ENV, KINDS, Fault, FaultPlan, armed, from_env, parse

__all__ = ["CANARY_KINDS", "ENV", "KINDS", "Fault", "FaultPlan", "armed", "from_env", "parse"]
