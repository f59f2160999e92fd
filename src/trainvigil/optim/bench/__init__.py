"""The optimizer benchmark's training side (``vigil bench-optim`` drives it): workloads, runs, specs, statistics.

:mod:`.workloads` (the canary workloads and a noisy quadratic), :mod:`.run` (one run through the
agent), :mod:`.specs` (which optimizers, ``module:Class``), :mod:`.stats` (pure numbers). Needs
torch; imports nothing of the daemon.
"""

from __future__ import annotations

from .specs import BASELINE, BUILTINS, OptimizerSpec, SpecError

__all__ = ["BASELINE", "BUILTINS", "OptimizerSpec", "SpecError"]
