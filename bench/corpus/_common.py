"""What every corpus workload shares: its command line, its fault log, a learning-rate schedule.

A workload is a real training script instrumented with the real agent (``trainvigil.init()``
reads ``VIGIL_RUN_ID`` and ``VIGIL_NATS_URL`` from the environment the recorder sets). The
one thing it tells the recorder besides what the agent sends is when it injected its fault:
one JSON line in ``--fault-log`` (kind, step, Unix time), written the moment the fault
starts, and a last line with the steps it completed. Nothing about the fault goes over
the wire, so detectors see exactly what a user's run would send.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch


def parser(description: str, *, steps: int, faults: tuple[str, ...]) -> argparse.ArgumentParser:
    """The flags every workload takes: ``--steps --seed --fault --fault-at --fault-log``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help="optimisation steps (PPO: updates)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fault", choices=("none", *faults), default="none")
    p.add_argument("--fault-at", type=int, default=-1, help="step at which the fault starts")
    p.add_argument("--fault-log", type=Path, default=None, help="JSON lines: the fault's step and time")
    return p


class FaultLog:
    """Where a workload says when its fault started and how far it got (JSON lines)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.injected = False

    def _write(self, record: dict[str, Any]) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")

    def inject(self, kind: str, step: int, **detail: Any) -> None:
        """The fault ``kind`` starts now, at ``step`` (logged once per run)."""
        if not self.injected:
            self.injected = True
            self._write({"record": "fault", "kind": kind, "step": step, "time": time.time(), **detail})

    def done(self, steps: int) -> None:
        """The loop completed ``steps`` steps (not written when the run crashed)."""
        self._write({"record": "done", "steps": steps, "time": time.time()})


def setup(seed: int) -> None:
    """One intra-op thread (the machine is shared) and seeded torch."""
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.manual_seed(seed)


def warmup_cosine(step: int, total: int, *, warmup: int, peak: float, floor: float = 0.0) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a cosine down to ``floor`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
