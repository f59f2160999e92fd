"""The optimizer benchmark's result on the wire: one ``optim_result`` event per (optimizer, workload, seed).

``vigil bench-optim`` publishes each result through an ordinary agent as a run event of kind
:data:`OPTIM_RESULT_EVENT` (fields: an :class:`OptimResult`); the daemon stores the event like any
other and materialises it as a row of ``optim_results`` in the same transaction. Both sides read
the fields from here: the CLI may not import the daemon's store, and the store may not import the
agent. Fields added later get defaults, so an older result still makes a row.
"""

from __future__ import annotations

import msgspec

OPTIM_RESULT_EVENT = "optim_result"


class OptimResult(msgspec.Struct, frozen=True, kw_only=True):
    """One benchmark run and its 10x-LR twin, measured.

    Attributes:
        run_id: the measured run (``optim-<optimizer>-<workload>-s<seed>``): its steps and alerts.
        bench_id: the benchmark that ran it (one ``vigil bench-optim``).
        optimizer: the name in the table (``adamw``, ``lion``, ... or the class's name).
        spec: ``module:Class`` built, and ``kwargs`` (JSON text) it was given besides ``lr``.
        lr: peak learning rate of the shared warm-up/cosine schedule.
        final_loss: mean loss over the last 5% of steps.
        steps_to_half: first step whose loss is at most half the first step's; ``None``: never.
        step_time_mean_s, step_time_p95_s: wall time of a training step (forward, backward, clip, step).
        state_bytes: bytes of the optimizer's state tensors after training.
        peak_bytes: how far Python-tracked allocations (tracemalloc, the whole process) rose above
            their level at the run's start over its first steps; torch's CPU tensors are not
            tracked (see ``state_bytes``). ``None``: not traced.
        unstable_run_id: the same run at ``unstable_lr_factor`` x the LR.
        stable: no ``non_finite`` or ``loss_spike`` page on that run.
        unstable_reason: the page that made it unstable (detector and step); empty when stable.
    """

    run_id: str
    bench_id: str = ""
    optimizer: str = ""
    spec: str = ""
    kwargs: str = "{}"
    workload: str = ""
    seed: int = 0
    lr: float = 0.0
    steps: int = 0
    initial_loss: float | None = None
    final_loss: float | None = None
    steps_to_half: int | None = None
    step_time_mean_s: float | None = None
    step_time_p95_s: float | None = None
    state_bytes: int | None = None
    peak_bytes: int | None = None
    unstable_run_id: str = ""
    unstable_lr_factor: float = 10.0
    stable: bool | None = None
    unstable_reason: str = ""


__all__ = ["OPTIM_RESULT_EVENT", "OptimResult"]
