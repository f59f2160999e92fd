"""Ray Train with trainvigil: a ``TorchTrainer`` of CPU workers trains an MLP with DDP. Inside each worker
``trainvigil.init()``, with no arguments, takes the rank, local rank and world size from Ray Train and
the run id from the experiment's name, so the workers log as the ranks of one run.

    vigil up &
    python examples/integrations/ray_train.py out/ --workers 2 --steps 50
    python examples/integrations/ray_train.py out/ --without    # the same training without trainvigil

``tests/e2e/test_ray_integration.py`` runs this script against a real broker and daemon (a local Ray
instance), and ``bench/integrations_overhead.py`` times it with and without trainvigil. The last line
printed is rank 0's step times and the seconds its loop took (``_common.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
from _common import StepTimes, add_arms, own_agent
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train_loop(config: dict[str, Any]) -> None:
    """One worker: its share of the training, logged through an agent that Ray Train places in the run."""
    import trainvigil

    args = config["args"]
    agent = own_agent(args) or (None if args.without else trainvigil.init())  # rank, world size, run id from Ray
    rank = ray.train.get_context().get_world_rank()
    net = torch.nn.Sequential(torch.nn.Linear(args.features, args.hidden), torch.nn.ReLU(),
                              torch.nn.Linear(args.hidden, 1))  # fmt: skip
    model = ray.train.torch.prepare_model(net)  # DDP over gloo
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.features, generator=torch.Generator().manual_seed(rank))
    y = x.sum(1, keepdim=True)

    times = StepTimes()
    began = time.perf_counter()
    for step in range(args.steps):
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if agent is not None:
            agent.log(step, loss=loss.detach(), step_time=time.perf_counter() - start)
        times.mark()
    summary = times.summary(time.perf_counter() - began)
    if agent is not None:
        agent.close()
    (args.out / f"times-rank{rank}.json").write_text(json.dumps(summary))  # the driver prints rank 0's


def main() -> None:
    parser = argparse.ArgumentParser(description="Ray Train's TorchTrainer with trainvigil in every worker")
    parser.add_argument("out", type=Path, help="Ray Train's storage folder")
    add_arms(parser, "ray-regression")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    here = os.path.dirname(os.path.abspath(__file__))  # the workers import _common from here
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})  # fmt: skip
    try:
        trainer = TorchTrainer(train_loop, train_loop_config={"args": args},
                               scaling_config=ScalingConfig(num_workers=args.workers),
                               run_config=RunConfig(name=args.run_id, storage_path=str(args.out)))  # fmt: skip
        trainer.fit()
    finally:
        ray.shutdown()
    print((args.out / "times-rank0.json").read_text())


if __name__ == "__main__":
    main()
