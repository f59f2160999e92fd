"""What the canary workloads share: their command line, one intra-op thread, the LR schedule.

A workload is an ordinary training script: ``trainvigil.init()`` reads ``VIGIL_RUN_ID``,
``VIGIL_NATS_URL`` and ``VIGIL_FAULT`` from the environment the canary runner sets, and the
faults act through ``trainvigil.torch.watch()`` and ``trainvigil.checkpoint`` as they would in a
user's script. Nothing here talks to the daemon.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def parser(description: str, *, steps: int) -> argparse.ArgumentParser:
    """``--steps`` (optimizer steps; RL: updates) and ``--seed``, the flags every workload takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help=f"optimizer steps (default {steps})")
    p.add_argument("--seed", type=int, default=0, help="the same seed gives the same data and the same run")
    return p


def setup(seed: int) -> torch.Generator:
    """One intra-op thread (a canary shares the machine with the job it guards) and seeded torch.

    Returns a generator for the workload's own draws, so that they do not depend on what else
    consumed torch's global one.
    """
    import torch  # here, not at the top: the two_rank launcher takes the command line without torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    # torch and the agent leave ~700 000 objects that live as long as the process: out of the
    # collector's sight, a canary's full collections cost it ~15 % less CPU (the job it guards keeps it).
    gc.freeze()
    return torch.Generator().manual_seed(seed)


def warmup_cosine(step: int, total: int, *, warmup: int, peak: float, floor: float) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a cosine down to ``floor`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))
