"""The demo's training loop: a small real model (torch if installed, else numpy) that logs
through the agent. Run by ``vigil demo`` as a subprocess, like any user script would be."""

from __future__ import annotations

import argparse
import time

import numpy as np

import trainvigil


def train_torch(steps: int, vigil: trainvigil.Agent, spike_at: int) -> None:
    import torch

    import trainvigil.torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # lr and step time come from watch(); the grad norm is clip_grad_norm_'s, logged below.
    trainvigil.torch.watch(model, opt, agent=vigil, grad_norm=False)
    x = torch.randn(2048, 32)
    y = x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(2048, 1)
    for step in range(steps):
        idx = torch.randint(0, len(x), (64,))
        batch = x[idx] * (100.0 if step == spike_at else 1.0)  # one corrupt batch: the detectors catch it
        loss = torch.nn.functional.mse_loss(model(batch), y[idx])
        opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        vigil.log(step, loss=loss, grad_norm=grad_norm, samples=64.0)


def train_numpy(steps: int, vigil: trainvigil.Agent, spike_at: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 32))
    y = x[:, :4].sum(axis=1) + 0.1 * rng.normal(size=2048)
    w = np.zeros(32)
    for step in range(steps):
        t0 = time.perf_counter()
        idx = rng.integers(0, len(x), 64)
        batch = x[idx] * (100.0 if step == spike_at else 1.0)  # one corrupt batch: the detectors catch it
        err = batch @ w - y[idx]
        grad = 2 * batch.T @ err / 64
        grad *= min(1.0, 10.0 / max(float(np.linalg.norm(grad)), 1e-12)) if step == spike_at else 1.0
        w -= 0.05 * grad
        vigil.log(
            step,
            loss=float(np.mean(err**2)),
            grad_norm=float(np.linalg.norm(grad)),
            lr=0.05,
            step_time=time.perf_counter() - t0,
            samples=64.0,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--spike-at", type=int, default=-1, help="feed one corrupt batch at this step")
    args = parser.parse_args()
    with trainvigil.init() as vigil:
        try:
            import torch  # noqa: F401

            vigil.event("start", framework="torch")
            train_torch(args.steps, vigil, args.spike_at)
        except ImportError:
            vigil.event("start", framework="numpy")
            train_numpy(args.steps, vigil, args.spike_at)


if __name__ == "__main__":
    main()
