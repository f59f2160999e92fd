"""Data-parallel training on CPU (DDP over gloo) with one trainvigil agent per rank.

The model, data and logging are those of ``train_mlp.py``; each rank trains on its own
shard and logs its own steps. Run it with torchrun::

    torchrun --nproc_per_node=2 examples/train_ddp.py
    torchrun --nproc_per_node=2 examples/train_ddp.py --steps 20        # a quick check
    VIGIL_RUN_ID=ddp-demo torchrun --nproc_per_node=2 examples/train_ddp.py

``trainvigil.init()`` takes the rank and world size from the ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE`` that torchrun sets, and the ranks of one torchrun share a run id; multi-node
jobs set ``VIGIL_RUN_ID`` so every node agrees. ``VIGIL_NATS_URL`` names the broker
(default ``nats://127.0.0.1:4222``).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from train_mlp import accuracy, build_parser, make_model, make_splits, train_step  # torchrun puts examples/ on sys.path

import trainvigil


def train(args: argparse.Namespace, rank: int, world_size: int) -> None:
    # Every rank builds the same data set (same seed), then keeps its own shard of it.
    torch.manual_seed(args.seed)
    x_train, y_train, x_eval, y_eval = make_splits(args.dim, args.seed)
    x_train, y_train = x_train[rank::world_size], y_train[rank::world_size]
    x_eval, y_eval = x_eval[rank::world_size], y_eval[rank::world_size]
    batches = torch.Generator().manual_seed(args.seed + 1 + rank)

    model = DistributedDataParallel(make_model(args.dim, args.hidden))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    with trainvigil.init() as vigil:
        for step in range(args.steps):
            idx = torch.randint(0, len(x_train), (args.batch_size,), generator=batches)
            # backward() all-reduces the gradients, so grad_norm agrees across ranks.
            s = train_step(model, optimizer, scheduler, x_train[idx], y_train[idx])
            vigil.log(step, loss=s.loss, grad_norm=s.grad_norm, lr=s.lr, step_time=s.step_time, samples=s.samples)
            if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
                # Every rank scores its shard; the mean over ranks is the global accuracy
                # (shards differ by at most one row). Rank 0 reports it once for the run.
                acc = torch.tensor(accuracy(model.module, x_eval, y_eval, tolerance=0.1))
                dist.all_reduce(acc, op=dist.ReduceOp.SUM)
                mean_acc = acc.item() / world_size
                if rank == 0:
                    vigil.event("eval", step=step, accuracy=mean_acc)
                    print(f"step {step + 1}/{args.steps} loss {s.loss:.4f} eval accuracy {mean_acc:.3f}", flush=True)


def main() -> None:
    parser = build_parser()
    parser.set_defaults(batch_size=64)  # per rank: two ranks see as many samples a step as train_mlp.py
    args = parser.parse_args()
    dist.init_process_group("gloo")
    try:
        train(args, dist.get_rank(), dist.get_world_size())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
