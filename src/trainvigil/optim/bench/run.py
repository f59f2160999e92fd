"""One benchmark run: a workload trained by one optimizer, logged through an ordinary agent.

The run is a real trainvigil run (``trainvigil.init(run_id=...)``): its steps, its run events and
whatever the detectors make of it land in the daemon's history. Every run uses the same schedule
(linear warm-up over the first 10% of steps, then a cosine down to a tenth, scaling each param
group's own peak LR), the workload's gradient clipping, and the seed's data order.

Measured here: each step's wall time, the optimizer's state bytes, and peak memory over the first
``TRACED_STEPS`` steps (optimizer state is made on the first), above its level at the run's start,
where the run's tensors live: CUDA's allocator peak on a GPU, tracemalloc's (if the caller started
it) on the CPU (:mod:`.memory` says what each sees). Step times are summarised after those steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

import trainvigil
from trainvigil.canary._common import warmup_cosine

from .memory import PeakMeter
from .specs import OptimizerSpec
from .workloads import BASE_LR, WORKLOADS

TRACED_STEPS = 10
WARMUP_SHARE, FLOOR = 0.1, 0.1


@dataclass
class RunRecord:
    """What one run measured; ``losses`` stop at the first non-finite one."""

    run_id: str
    lr: float
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    state_bytes: int = 0
    peak_bytes: int | None = None

    @property
    def timed(self) -> list[float]:
        """Step times after the traced ones (all of them in a run too short to have any)."""
        return self.step_times[TRACED_STEPS:] or self.step_times


def run_id(optimizer: str, workload: str, seed: int, lr_factor: float = 1.0) -> str:
    """``optim-<optimizer>-<workload>-s<seed>``, ``-x<factor>`` for a run at a multiple of the LR."""
    base = f"optim-{optimizer}-{workload}-s{seed}"
    return base if lr_factor == 1.0 else f"{base}-x{lr_factor:g}"


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    tensors = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def run(
    spec: OptimizerSpec,
    workload: str,
    seed: int,
    steps: int,
    *,
    lr_factor: float = 1.0,
    agent_options: Mapping[str, Any] | None = None,
    device: str = "cpu",
) -> RunRecord:
    """Train ``workload`` for ``steps`` with ``spec`` at ``lr_factor`` x its peak LR, logging every step.

    Args:
        agent_options: passed to ``trainvigil.init`` (``nats_url`` and any agent option).
        device: where the workload's model and data live (``"cuda"``: the peak is CUDA's).
    """
    job = WORKLOADS[workload](seed, device)
    lr = spec.peak_lr(BASE_LR[workload]) * lr_factor
    optimizer = spec.build(job.parameters(), lr)
    peaks = [group["lr"] for group in optimizer.param_groups]
    record = RunRecord(run_id(spec.name, workload, seed, lr_factor), lr)
    config: dict[str, Any] = {"optimizer": spec.name, "spec": spec.target, "kwargs": spec.kwargs, "workload": workload}
    config |= {"seed": seed, "lr": lr, "steps": steps, "lr_factor": lr_factor, "max_norm": job.max_norm}
    config["device"] = device
    meter = PeakMeter(torch.device(device))
    with trainvigil.init(run_id=record.run_id, config=config, **dict(agent_options or {})) as vigil:
        for step in range(steps):
            factor = warmup_cosine(step, steps, warmup=max(1, int(steps * WARMUP_SHARE)), peak=1.0, floor=FLOOR)
            for group, peak in zip(optimizer.param_groups, peaks, strict=True):
                group["lr"] = peak * factor
            if step == 0:
                meter.start()
            started = time.perf_counter()
            loss, metrics = job.step(optimizer)
            elapsed = time.perf_counter() - started
            if step + 1 == TRACED_STEPS:
                record.peak_bytes = meter.read()
            record.step_times.append(elapsed)
            vigil.log(step, loss=loss, lr=lr * factor, step_time=elapsed, **metrics)
            if not math.isfinite(loss):
                break  # diverged: logged for the detectors, nothing left to learn
            record.losses.append(loss)
        if record.step_times and len(record.step_times) < TRACED_STEPS:  # a run shorter than TRACED_STEPS
            record.peak_bytes = meter.read()
    record.state_bytes = state_bytes(optimizer)
    return record
