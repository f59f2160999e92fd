"""What the drop-in shims cost the training thread per step, beside the agent's own ``log()`` and the libraries
they stand in for.

Per step, two metrics (a loss and a learning rate) through each of:
- ``agent.log(step, loss=..., lr=...)``: the agent itself, the floor;
- ``trainvigil.wandb.log({"train/loss": ..., "lr": ...})``: the W&B shim (``train/loss`` also logged as ``loss``);
- ``wandb.log(...)`` in ``mode="offline"``: the real W&B, when installed (the ``bench`` extra);
- ``SummaryWriter.add_scalar`` twice (``Loss/train``, ``charts/learning_rate``): the TensorBoard shim;
- ``torch.utils.tensorboard.SummaryWriter.add_scalar`` twice: the real TensorBoard, when installed.
Against a real nats-server and daemon, so the agents' threads publish as in training. Each arm logs ``--steps``
steps ``--repeats`` times; the table gives the median microseconds per step and the ratios to the agent's
``log()`` and to the library the shim replaces. A library that is not installed says so; ours are timed anyway.

    python bench/compat_overhead.py                      # --steps 20000 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _procs import start_services
from tables import table

import trainvigil
import trainvigil.wandb as vigil_wandb
from trainvigil.tensorboard import SummaryWriter as VigilWriter

Arm = Callable[[int], None]
"""Logs one step's two metrics."""


def per_step_us(arm: Arm, steps: int, repeats: int) -> float:
    """The median over ``repeats`` of the microseconds one step's logging took (``steps`` steps each)."""
    rounds = []
    for r in range(repeats):
        start = time.perf_counter()
        for step in range(r * steps, (r + 1) * steps):
            arm(step)
        rounds.append((time.perf_counter() - start) / steps * 1e6)
    return statistics.median(rounds)


def real_wandb(tmp: Path) -> tuple[Arm, Callable[[], None]] | str:
    try:
        import wandb
    except ImportError:
        return "not installed"
    run = wandb.init(mode="offline", dir=str(tmp), project="compat-bench")

    def arm(step: int) -> None:
        run.log({"train/loss": 1.0 / (step + 1), "lr": 3e-4})

    return arm, run.finish


def real_tensorboard(tmp: Path) -> tuple[Arm, Callable[[], None]] | str:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return "not installed"
    writer = SummaryWriter(str(tmp / "tb"))

    def arm(step: int) -> None:
        writer.add_scalar("Loss/train", 1.0 / (step + 1), step)
        writer.add_scalar("charts/learning_rate", 3e-4, step)

    return arm, writer.close


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="compat-bench-")))
        url = start_services(stack, tmp).url
        options: dict[str, Any] = {"nats_url": url}
        times: dict[str, float | str] = {}

        agent = trainvigil.init("compat-agent", config=None, **options)
        times["agent.log"] = per_step_us(lambda s: agent.log(s, loss=1.0 / (s + 1), lr=3e-4), args.steps, args.repeats)
        agent.close()

        run = vigil_wandb.init(project="compat-bench", id="compat-wandb", vigil=options)
        times["trainvigil.wandb.log"] = per_step_us(
            lambda s: run.log({"train/loss": 1.0 / (s + 1), "lr": 3e-4}), args.steps, args.repeats
        )
        run.finish()

        writer = VigilWriter(run_id="compat-tensorboard", vigil=options)

        def ours_tb(step: int) -> None:
            writer.add_scalar("Loss/train", 1.0 / (step + 1), step)
            writer.add_scalar("charts/learning_rate", 3e-4, step)

        times["trainvigil SummaryWriter.add_scalar x2"] = per_step_us(ours_tb, args.steps, args.repeats)
        writer.close()

        for name, start in (("wandb.log (offline)", real_wandb), ("TensorBoard add_scalar x2", real_tensorboard)):
            got = start(tmp)
            if isinstance(got, str):
                times[name] = got
            else:
                arm, end = got
                times[name] = per_step_us(arm, args.steps, args.repeats)
                end()

    floor = float(times["agent.log"])
    real = {
        "trainvigil.wandb.log": "wandb.log (offline)",
        "trainvigil SummaryWriter.add_scalar x2": "TensorBoard add_scalar x2",
    }
    rows = []
    for name, us in times.items():
        if isinstance(us, str):
            rows.append([name, us, "-", "-"])
            continue
        other = times.get(real.get(name, ""))
        vs_real = f"{us / other:.2f}x" if isinstance(other, float) else ("-" if name not in real else "not installed")
        rows.append([name, f"{us:.2f}", f"{us / floor:.2f}x", vs_real])
    print(f"{args.steps} steps x {args.repeats} repeats, two metrics a step; median us per step")
    print(table(["call", "us/step", "vs agent.log", "vs the library"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
