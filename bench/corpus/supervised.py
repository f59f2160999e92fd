"""A small CNN on scikit-learn's bundled handwritten digits, instrumented with ``trainvigil.torch.watch()``.

Real supervised training on a real data set that installs with scikit-learn (no download):
8x8 digit images, 80/20 split, AdamW, linear warm-up then cosine decay, gradient
clipping at 1.0. ``watch(model, optimizer, grad_norm=False)`` logs ``lr`` and ``step_time``
from the optimizer hooks; the loop logs ``loss``, the pre-clip ``grad_norm`` and ``samples``,
and every 500 steps an ``eval`` event with the held-out accuracy. Faults (from ``--fault-at``):

- ``poison``: one corrupted batch (pixels unnormalised, x20, and labels shuffled).
- ``nan``: one NaN pixel in that step's batch; the weights go NaN and stay so.
- ``slowdown``: every step from then on takes 1.4x as long (a slower input pipeline: the
  loop sleeps 0.4x the median compute time of the 200 steps before the fault, a fixed
  delay, so that the machine's other load does not change the size of the fault).
- ``straggler``: as ``slowdown`` but 1.55x, on the rank given by ``--slow-rank`` only; the
  recorder runs two ranks (``RANK``/``WORLD_SIZE``) as two processes of one run.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F

import trainvigil
import trainvigil.torch

from ._common import FaultLog, parser, set_lr, setup, warmup_cosine

SLOWER = {"slowdown": 0.4, "straggler": 0.55}
"""Extra time per step, as a share of the median step before the fault."""


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip


def splits(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits scaled to [0, 1] as ``x_train, y_train, x_test, y_test`` (a fixed 80/20 split per seed)."""
    digits = load_digits()
    x = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=10_000, faults=("poison", "nan", "slowdown", "straggler"))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--slow-rank", type=int, default=1)
    args = p.parse_args()
    setup(args.seed)
    rank = int(os.environ.get("RANK", "0"))
    faults = FaultLog(args.fault_log)
    x_train, y_train, x_test, y_test = splits(args.seed)
    gen = torch.Generator().manual_seed(args.seed + rank)

    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    vigil = trainvigil.init()
    trainvigil.torch.watch(model, optimizer, grad_norm=False)  # we clip: the pre-clip norm is logged below
    slows_here = args.fault == "slowdown" or (args.fault == "straggler" and rank == args.slow_rank)
    recent: deque[float] = deque(maxlen=200)
    delay: float | None = None
    for step in range(args.steps):
        start = time.perf_counter()
        faulty = args.fault != "none" and step >= args.fault_at
        set_lr(optimizer, warmup_cosine(step, args.steps, warmup=300, peak=args.lr))
        idx = torch.randint(0, len(x_train), (args.batch_size,), generator=gen)
        x, y = x_train[idx], y_train[idx]
        if faulty and step == args.fault_at and args.fault in ("poison", "nan"):
            faults.inject(args.fault, step)
            if args.fault == "poison":
                x, y = x * 16.0 * 20.0, y[torch.randperm(len(y), generator=gen)]
            else:
                x = x.clone()
                x[0, 0, 3, 3] = float("nan")
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        vigil.log(step, loss=loss.detach(), grad_norm=grad_norm, samples=len(x))
        if not faulty:
            recent.append(time.perf_counter() - start)
        elif slows_here:
            faults.inject(args.fault, step, rank=rank)
            delay = delay if delay is not None else SLOWER[args.fault] * statistics.median(recent)
            time.sleep(delay)
        if (step + 1) % 500 == 0:
            with torch.no_grad():
                accuracy = (model(x_test).argmax(-1) == y_test).float().mean().item()
            vigil.event("eval", step=step, accuracy=accuracy)
            print(f"rank {rank} step {step + 1}/{args.steps} loss {loss.item():.4f} acc {accuracy:.3f}", flush=True)
    faults.done(args.steps)
    vigil.close(timeout=30)


if __name__ == "__main__":
    main()
