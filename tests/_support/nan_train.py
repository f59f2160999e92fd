"""A real torch training process for the alert tests: the loss turns NaN at chosen steps.

Usage: nan_train.py RUN_ID STEPS --nan-at N [N ...]
At each step in ``--nan-at`` the batch is poisoned with a NaN, so the loss and the gradient
norm are NaN; the optimizer skips that step (as a guarded training loop does) and training
goes on with finite losses. Exit code 0 only if close() reports every event delivered.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import torch

import trainvigil

# What the imports made (torch's ~170 000 objects) is never garbage: frozen, no collection walks it, the last one at
# exit included, which took ~0.7 CPU-s of the process's ~4.
gc.freeze()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_id")
    parser.add_argument("steps", type=int)
    parser.add_argument("--nan-at", type=int, nargs="+", default=[])
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    target = torch.randn(8, 1)
    poisoned = set(args.nan_at)
    agent = trainvigil.init(run_id=args.run_id, rank=0, flush_interval=0.05)
    for step in range(args.steps):
        started = time.perf_counter()
        x = torch.randn(32, 8)
        if step in poisoned:
            x[0, 0] = float("nan")
        loss = torch.nn.functional.mse_loss(model(x), x @ target)
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9)
        if torch.isfinite(loss):
            optimizer.step()
        agent.log(step, loss=loss, grad_norm=grad_norm, lr=0.01, step_time=time.perf_counter() - started, samples=32)
    ok = agent.close(timeout=60)
    print(agent.stats(), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
