"""``python -m trainvigil.canary.supervised``: a small MLP classifier, trained for real, watched like a user's script.

The task is made in code, the same for every run: inputs drawn from a normal distribution,
labelled by a fixed random *teacher* network, with a share of labels replaced at random (so the
loss settles near 1 nat, as a real data set's does, instead of collapsing to 0). Each step draws
a fresh batch from a stream seeded by ``--seed`` and the rank, so the model cannot memorise it and
the held-out loss follows the training loss.

Training: each batch waits ``--input-wait`` (10 ms) on a simulated input pipeline, then AdamW,
linear warm-up then cosine decay (spanning the default length, so a shorter ``--steps`` run is the
start of the default one), gradients clipped at 1.0 (the pre-clip norm is logged, as
``clip_grad_norm_`` returns it), ``trainvigil.torch.watch()`` for ``lr`` and ``step_time`` (and
for the faults ``VIGIL_FAULT`` arms), the GIL sampler on. Every
``--eval-every`` steps an ``eval`` event carries the held-out ``val_loss`` and accuracy; every
``--ckpt-every`` steps a checkpoint is saved with ``trainvigil.checkpoint.save`` and loaded back
verified, as a run that resumes from it would: a corrupt one (``ckpt_corrupt``) is reported by
the agent, and training goes on from the state in memory.

Run as one rank of several (``RANK``/``WORLD_SIZE``, as ``two_rank`` starts it), each rank draws
its own batches and accepts the ``straggler`` fault.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import trainvigil
import trainvigil.torch
from trainvigil import checkpoint
from trainvigil.agents import faults
from trainvigil.errors import CheckpointIntegrityError

from . import WORKLOADS
from ._common import parser, setup, warmup_cosine

DIM, CLASSES, HIDDEN = 32, 10, 256
LABEL_NOISE = 0.1
"""Share of labels replaced by a random class."""
STEPS = WORKLOADS["supervised"].steps
WARMUP = 100
INPUT_WAIT = 0.01
"""Each batch arrives from a (simulated) input pipeline after 10 ms, as a real job waits on its loader.

So a step is ~12 ms of which ~2 are compute: the canary leaves the CPU to the job it guards, and
its step time barely moves when a neighbour takes the CPU, which is what keeps ``slowdown`` and
``straggler`` (judged on wall-clock step times) silent on a clean run on a busy machine."""


class Task:
    """The teacher's labelling of normal inputs: ``draw`` makes training rows, ``held_out`` is fixed."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(1234)  # the task itself does not change with --seed
        self.w1 = torch.randn(DIM, 64, generator=gen) / DIM**0.5
        self.w2 = torch.randn(64, CLASSES, generator=gen) / 8.0
        self.held_out = self.draw(2048, gen)

    def draw(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, DIM, generator=gen)
        y = (torch.tanh(3 * x @ self.w1) @ self.w2).argmax(-1)
        noisy = torch.rand(n, generator=gen) < LABEL_NOISE
        return x, torch.where(noisy, torch.randint(0, CLASSES, (n,), generator=gen), y)


def make_model() -> nn.Module:
    """Two tanh layers, each after a LayerNorm without gain or bias.

    The shape is chosen for the ``lr_spike`` canary: normalised, bounded activations keep the gradient
    norm within ~2.6x its level when an LR x100 sends the loss to 2-5x its own, so ``loss_spike``
    pages and ``grad_spike`` (which needs 3x) stays silent. With ReLU and no normalisation the
    same LR jump also multiplies the gradient norm 10-60x and both page.
    """
    return nn.Sequential(
        nn.Linear(DIM, HIDDEN), nn.LayerNorm(HIDDEN, elementwise_affine=False), nn.Tanh(),
        nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN, elementwise_affine=False), nn.Tanh(),
        nn.Linear(HIDDEN, CLASSES),
    )  # fmt: skip


@torch.no_grad()
def evaluate(model: nn.Module, rows: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, float]:
    """Held-out cross-entropy and accuracy."""
    x, y = rows
    logits = model(x)
    return F.cross_entropy(logits, y).item(), (logits.argmax(-1) == y).float().mean().item()


def save_and_verify(vigil: trainvigil.Agent, state: dict[str, object], path: Path, step: int) -> None:
    """Save a checkpoint and load it back verified; a corrupt one is reported, not fatal.

    The agent publishes the failed verification (the daemon's ``ckpt_mismatch`` pages on it); the
    run keeps training from the state in memory, as a job whose checkpoint store let it down would.
    """
    with vigil.phase("checkpoint"):
        checkpoint.save(state, path, step=step)
        try:
            checkpoint.load(path, weights_only=True)
        except CheckpointIntegrityError as error:
            print(f"step {step}: checkpoint {path} failed verification: {error}", file=sys.stderr, flush=True)


def train(args: argparse.Namespace, rank: int) -> None:
    """The training loop of one rank, from ``trainvigil.init()`` to its close."""
    gen = setup(args.seed * 1000 + rank)
    horizon = max(args.steps, STEPS)  # step K meets the same LR however long the run
    task = Task()
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    with tempfile.TemporaryDirectory(prefix="vigil-canary-") as scratch, trainvigil.init(gil=True) as vigil:
        ckpt = (args.ckpt_dir or Path(scratch)) / f"supervised-r{rank}.pt"
        trainvigil.torch.watch(model, optimizer, grad_norm=False)  # the loop logs the pre-clip norm itself
        for step in range(args.steps):
            for group in optimizer.param_groups:
                group["lr"] = warmup_cosine(step, horizon, warmup=WARMUP, peak=args.lr, floor=args.lr / 20)
            time.sleep(args.input_wait)  # the input pipeline delivering the batch
            x, y = task.draw(args.batch_size, gen)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            vigil.log(step, loss=loss.detach(), grad_norm=grad_norm, samples=args.batch_size)
            last = step + 1 == args.steps
            if (step + 1) % args.eval_every == 0 or last:
                val_loss, accuracy = evaluate(model, task.held_out)
                vigil.event("eval", step=step, val_loss=val_loss, accuracy=accuracy)
                print(f"rank {rank} step {step + 1}/{args.steps} loss {loss.item():.4f} val {val_loss:.4f}", flush=True)
            if (step + 1) % args.ckpt_every == 0 or last:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                save_and_verify(vigil, state, ckpt, step)


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0].split(": ", 1)[1], steps=STEPS)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--ckpt-every", type=int, default=250)
    p.add_argument("--ckpt-dir", type=Path, default=None, help="default: a temporary directory, removed at exit")
    p.add_argument("--input-wait", type=float, default=INPUT_WAIT, help="seconds each batch takes to arrive")
    args = p.parse_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one rank of several: what two_rank arms in a rank
        faults.accept(*WORKLOADS["two_rank"].faults)
    train(args, int(os.environ.get("RANK", "0")))


if __name__ == "__main__":
    main()
