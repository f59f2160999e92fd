"""What trainvigil adds to a Ray Train step, measured inside the workers: blocks with and without an agent.

``integrations_overhead.py`` compares whole runs in fresh processes, and for Ray Train on two cores
that cannot resolve 1 %: two DDP workers share one core, a step ends when the slower rank's does, and
the baseline's median step moved from 2.1 to 3.7 ms between runs. Here one ``TorchTrainer`` run does
the comparison inside its workers, as ``jax_grad_health.py --agent`` does for JAX: each worker trains
the docs' Ray Train example (DDP over gloo, an MLP ``features -> hidden -> 1``) in ``--rounds``
rounds of two blocks, in a random order that every worker draws alike. In the block with trainvigil,
each worker starts its agent with ``trainvigil.init()`` and no arguments (rank, world size and run id
from Ray Train, what the integration is), lets it connect and settle, logs the loss and step time at
every step as the example does, and closes it after the block. A block is ``--lead`` steps that are not
timed (the agent's first wake-up) and then ``--block`` timed steps. The ratio is the median over rounds
of rank 0's mean step with the agent to its mean step without, in the same round, with a bootstrap 95 %
interval; the ratio of median steps is printed beside it. The mean is the one to judge: the agent's
thread packs and publishes once per flush interval (1 s by default), and the steps that pay for it are
a few in a thousand, which a median leaves out. So a timed block spans at least two flush intervals
(2 000 steps of ~1.4 ms), and the agent's last, partial interval falls after it, in ``close()``. A real
nats-server and daemon run pinned to the machine's last core; start this under ``taskset`` to keep Ray
and its workers off that core.

    taskset -c 0 python bench/ray_train_overhead.py             # 2 workers on one core, services on the other
    taskset -c 0 python bench/ray_train_overhead.py --workers 1
    taskset -c 0 python bench/ray_train_overhead.py --agent-cpu 1   # the agents' threads beside the services
    taskset -c 0 python bench/ray_train_overhead.py --runs 6        # six runs, and the interval over runs
    python bench/ray_train_overhead.py --spread --runs 3            # a core per worker, nats-server alone

Two runs of the same code can differ by more than one run's interval is wide (that interval covers its
rounds, not what differs between runs: the workers' placement, the processes' memory layout). With
``--runs N`` each run gets fresh workers (and its own block order), and the mean of the runs' ratios gets
a Student's t interval over the runs.

``--agent-cpu N`` moves each agent's thread onto CPU ``N``: what the workers pay when the agents'
threads do not share their core, as on a machine with a core to spare.

``--spread`` gives each worker a core of its own, as a real Ray Train deployment does (rank ``r``, every
thread of its process, on CPU ``r``; run it without ``taskset``). The daemon is stopped once it has made the
stream, so nothing ingests beside a rank: the agents publish to nats-server alone (on the last core, beside the last
rank), which stores and acknowledges as always. On a machine with fewer cores than workers, ranks share cores again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _procs import shut_down, start_services
from _stats import mean_interval, median_interval
from tables import table


def train_loop(config: dict[str, Any]) -> None:
    """One worker: ``rounds`` pairs of blocks, with and without an agent, in the order every worker draws."""
    import random
    import time

    import ray.train
    import ray.train.torch
    import torch
    from _procs import pin, pin_agent_thread
    from _stats import step_times

    import trainvigil

    rank = ray.train.get_context().get_world_rank()
    net = torch.nn.Sequential(torch.nn.Linear(config["features"], config["hidden"]), torch.nn.ReLU(),
                              torch.nn.Linear(config["hidden"], 1))  # fmt: skip
    model = ray.train.torch.prepare_model(net)  # DDP over gloo
    if config["spread"]:  # every thread of this worker (gloo's included), and the agent's thread later, on its own core
        pin(os.getpid(), {rank % (os.cpu_count() or 1)})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(config["batch"], config["features"], generator=torch.Generator().manual_seed(rank))
    y = x.sum(1, keepdim=True)
    done = 0

    def block(n: int, agent: Any) -> tuple[float, float]:
        """The mean and the median step of ``n`` steps after the first ``config["lead"]``, in seconds; with
        ``agent``, each step logged as the example does."""
        nonlocal done
        marks = [time.perf_counter()]
        for i in range(config["lead"] + n):
            start = marks[-1]
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if agent is not None:
                agent.log(done + i, loss=loss.detach(), step_time=time.perf_counter() - start)
            marks.append(time.perf_counter())
        done += config["lead"] + n
        return step_times(marks, config["lead"])

    block(100, None)  # warm up
    rng = random.Random(config["seed"])
    times: dict[str, list[tuple[float, float]]] = {"without": [], "with": []}  # (mean, median) a block
    for _ in range(config["rounds"]):
        order = ["without", "with"]
        rng.shuffle(order)
        for arm in order:
            if arm == "with":
                agent = trainvigil.init()  # rank, world size and run id from Ray Train
                if config["agent_cpu"] is not None:
                    pin_agent_thread(config["agent_cpu"])
                agent.flush(10)
                time.sleep(config["settle"])
                times[arm].append(block(config["block"], agent))
                agent.close()
            else:
                times[arm].append(block(config["block"], None))
    if rank == 0:
        Path(config["out"]).write_text(json.dumps(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=24, help="pairs of blocks, each pair in a random order")
    parser.add_argument(
        "--block", type=int, default=2000, help="timed steps per block: two flush intervals at least, at ~1.4 ms a step"
    )
    parser.add_argument("--lead", type=int, default=300, help="steps at a block's start that are not timed")
    parser.add_argument("--settle", type=float, default=0.3, help="seconds between an agent's start and its block")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--agent-cpu", type=int, help="each agent's thread on this CPU (default: its worker's)")
    parser.add_argument("--runs", type=int, default=1, help="TorchTrainer runs, each with fresh workers")
    parser.add_argument(
        "--spread",
        action="store_true",
        help="each worker on a core of its own (rank r on cpu r), nats-server alone: no daemon ingests beside a rank",
    )
    parser.add_argument("--save", type=Path, help="also write rank 0's block means and medians (s) here as JSON")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args(argv)

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    with tempfile.TemporaryDirectory(prefix="bench-ray-") as name, contextlib.ExitStack() as stack:
        tmp = Path(name)
        svc = start_services(stack, tmp)
        last = (os.cpu_count() or 1) - 1
        svc.pin(last)
        os.environ.update(VIGIL_NATS_URL=svc.url, VIGIL_LOG_LEVEL="warning")  # the workers inherit them
        if args.spread:  # the daemon made the stream; JetStream stores and acknowledges without it
            shut_down(svc)
            print(f"  nats-server on cpu {last} (the daemon stopped once the stream existed); worker r on cpu r")
        else:
            print(f"  nats-server and the daemon on cpu {last}; Ray on cpus {sorted(os.sched_getaffinity(0))}")
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        runs: list[dict[str, list[list[float]]]] = []
        try:
            for k in range(args.runs):
                config = {**vars(args), "seed": k, "out": str(tmp / f"times{k}.json")}
                run = RunConfig(name=f"ray-overhead-{os.getpid()}-{k}", storage_path=str(tmp))
                scaling = ScalingConfig(num_workers=args.workers)
                TorchTrainer(train_loop, train_loop_config=config, scaling_config=scaling, run_config=run).fit()
                runs.append(json.loads((tmp / f"times{k}.json").read_text()))
                if args.runs > 1:
                    print(f"  run {k + 1} of {args.runs} done", flush=True)
        finally:
            ray.shutdown()
    if args.save is not None:
        args.save.write_text(json.dumps(runs[0] if args.runs == 1 else runs))
    where = "" if args.agent_cpu is None else f", agent threads on cpu {args.agent_cpu}"
    where += ", a core each" if args.spread else ""
    model = f"DDP MLP {args.features}-{args.hidden}-1, batch {args.batch}, {args.workers} workers{where}"
    rows = []
    per_run: dict[str, list[float]] = {"mean": [], "median": []}  # each run's ratio of mean steps, of median steps
    for k, times in enumerate(runs, 1):
        name = model if args.runs == 1 else f"{model}, run {k}"
        cells: list[str] = []
        for i, stat in enumerate(("mean", "median")):  # each block is (mean, median)
            w, wo = [b[i] for b in times["with"]], [b[i] for b in times["without"]]
            ratios = [a / b for a, b in zip(w, wo, strict=True)]
            per_run[stat].append(statistics.median(ratios))
            low, high = median_interval(ratios)
            ms = f"{1e3 * statistics.median(wo):.3f} / {1e3 * statistics.median(w):.3f}"
            cells += [ms, f"{per_run[stat][-1]:.3f}x ({low:.3f}-{high:.3f})"]
        rows.append((name, *cells))
    print()
    header = ("model", "mean step ms, without / with", "ratio (95 % interval)", "median step ms", "ratio of medians")
    print(table(header, rows))
    if args.runs > 1:
        # Each run's interval covers its rounds, not what differs between runs (the workers' placement,
        # memory layout): the runs' ratios, as independent samples, give the mean's interval.
        for stat in ("mean", "median"):
            low, high = mean_interval(per_run[stat])
            mean = statistics.fmean(per_run[stat])
            print(f"\nover {args.runs} runs, {stat} steps: mean ratio {mean:.4f}x, "
                  f"95 % interval {low:.4f}-{high:.4f} (Student's t)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
