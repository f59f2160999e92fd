"""A plain torch training loop that streams its metrics to trainvigil.

A small MLP learns a noisy non-linear regression on synthetic data; every step logs loss,
grad norm, learning rate, step time and samples, and every 100 steps an ``eval`` event
carries the held-out accuracy. Run it beside a daemon::

    vigil up &                                   # or: docker compose up -d
    VIGIL_RUN_ID=mlp-demo python examples/train_mlp.py --steps 300
    VIGIL_FAULT=nan_grad@50 python examples/train_mlp.py   # a NaN gradient at step 50: a non_finite page

Without a broker it still runs to completion: the agent never blocks the loop, and at exit
it waits at most ``VIGIL_CLOSE_TIMEOUT`` seconds (default 10) to deliver what it holds.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import NamedTuple

import torch
from torch import nn

import trainvigil
import trainvigil.torch


def make_data(n: int, w: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` inputs and their noisy targets ``y = sin(3 x @ w) + noise``."""
    x = torch.randn(n, w.shape[0], generator=generator)
    y = torch.sin(3 * x @ w) + 0.05 * torch.randn(n, 1, generator=generator)
    return x, y


def make_splits(dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training and held-out rows of one function: ``x_train, y_train, x_eval, y_eval``."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, 1, generator=generator) / dim**0.5
    return *make_data(8192, w, generator), *make_data(512, w, generator)


def make_model(dim: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, tolerance: float) -> float:
    """Share of predictions within ``tolerance`` of the target (a regression 'accuracy')."""
    return (model(x) - y).abs().le(tolerance).float().mean().item()


class Step(NamedTuple):
    """What one step reports: trainvigil's detectors know these names."""

    loss: float
    grad_norm: float  # before clipping
    lr: float
    step_time: float  # seconds
    samples: int


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    x: torch.Tensor,
    y: torch.Tensor,
) -> Step:
    """One optimisation step on the batch ``(x, y)``, gradients clipped to norm 1."""
    start = time.perf_counter()
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    return Step(loss.item(), float(grad_norm), lr, time.perf_counter() - start, len(x))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    torch.manual_seed(args.seed)
    x_train, y_train, x_eval, y_eval = make_splits(args.dim, args.seed)
    batches = torch.Generator().manual_seed(args.seed + 1)

    model = make_model(args.dim, args.hidden)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    with trainvigil.init() as vigil:
        # Hooks the optimizer: lr and step time per step, and the faults VIGIL_FAULT arms (the
        # script logs the clipped norm itself, so watch() does not compute one).
        trainvigil.torch.watch(model, optimizer, grad_norm=False)
        for step in range(args.steps):
            idx = torch.randint(0, len(x_train), (args.batch_size,), generator=batches)
            s = train_step(model, optimizer, scheduler, x_train[idx], y_train[idx])
            vigil.log(step, loss=s.loss, grad_norm=s.grad_norm, lr=s.lr, step_time=s.step_time, samples=s.samples)
            if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
                acc = accuracy(model, x_eval, y_eval, tolerance=0.1)
                vigil.event("eval", step=step, accuracy=acc)
                print(f"step {step + 1}/{args.steps} loss {s.loss:.4f} eval accuracy {acc:.3f}", flush=True)

    stats = vigil.stats()
    print(
        f"trainvigil: run {vigil.run_id}: {stats.get('delivered_events', 0)} events delivered, "
        f"dropped {stats.get('dropped') or 'none'}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
