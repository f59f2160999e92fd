"""A small MLP fitting a smooth curve, instrumented with ``trainvigil.torch.watch()``: a loss that converges near zero.

Real training on data it makes itself (no download): 4 000 points of ``sin(3x) + x²/2`` on
``[-2, 2]`` without noise, a 1-64-64-1 tanh MLP, mean squared error, batches of 64, AdamW,
linear warm-up then cosine decay, gradient clipping at 1.0. The loss falls from ~1 to ~1e-6:
near its floor Adam's steps make the loss blip to 5-60x its recent level for five steps and
more, which is healthy training (what a loss detector must not page on).
``watch(model, optimizer, grad_norm=False)`` logs ``lr`` and ``step_time``; the loop logs
``loss``, the pre-clip ``grad_norm`` and ``samples``, and every 1 000 steps an ``eval`` event
with the mean squared error on a held-out grid. No faults: the corpus holds it as a clean run.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import trainvigil
import trainvigil.torch

from ._common import FaultLog, parser, set_lr, setup, warmup_cosine


def curve(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(3 * x) + 0.5 * x**2


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=10_000, faults=())
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()
    setup(args.seed)
    faults = FaultLog(args.fault_log)
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.rand(4000, 1, generator=gen) * 4 - 2
    y = curve(x)
    grid = torch.linspace(-2, 2, 512).unsqueeze(1)
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    vigil = trainvigil.init()
    trainvigil.torch.watch(model, optimizer, grad_norm=False)  # we clip: the pre-clip norm is logged below
    for step in range(args.steps):
        set_lr(optimizer, warmup_cosine(step, args.steps, warmup=300, peak=args.lr))
        idx = torch.randint(0, len(x), (args.batch_size,), generator=gen)
        loss = F.mse_loss(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        vigil.log(step, loss=loss.detach(), grad_norm=grad_norm, samples=len(idx))
        if (step + 1) % 1000 == 0:
            with torch.no_grad():
                mse = F.mse_loss(model(grid), curve(grid)).item()
            vigil.event("eval", step=step, mse=mse)
            print(f"step {step + 1}/{args.steps} loss {loss.item():.3g} eval mse {mse:.3g}", flush=True)
    faults.done(args.steps)
    vigil.close(timeout=30)


if __name__ == "__main__":
    main()
