"""What the drop-ins cost the training thread per call, side by side with the libraries they stand in for.

In one run, each call timed on its own (``perf_counter_ns`` around it), pooled over ``--repeats`` rounds that
take the arms in turn:
- ``trainvigil.wandb.log({"train/loss": ..., "lr": ...}, step=...)`` against the real ``wandb.log`` with the same
  arguments, in ``mode="offline"`` (``WANDB_DIR`` in a temporary directory, ``WANDB_SILENT``);
- ``trainvigil.tensorboard.SummaryWriter.add_scalar("Loss/train", ...)`` against
  ``torch.utils.tensorboard.SummaryWriter.add_scalar`` with the same arguments (event files in a temporary
  directory);
- ``agent.log(step, loss=..., lr=...)``, the agent under both drop-ins: the floor.
The trainvigil arms log into a real nats-server and daemon, so the agents' threads publish as in training. The
table gives the median and p99 microseconds a call and how many times cheaper the drop-in is by the median; the
target is :data:`TARGET`. The peers are the ``bench`` extra (``pip install 'trainvigil[bench]'``); one that is
not installed says so and ours are timed anyway.

    python bench/compat_overhead.py                      # --calls 20000 --repeats 5
    python bench/compat_overhead.py --check              # exit 1 when a drop-in misses the target
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _procs import start_services
from tables import table

import trainvigil
import trainvigil.wandb as vigil_wandb
from trainvigil.tensorboard import SummaryWriter as VigilWriter

TARGET = 30.0
"""How many times cheaper than the library a drop-in's call is, by the median, at least."""
WARMUP = 1000
"""Untimed calls before an arm's first round (caches, the first row's allocations, the real writers' threads)."""
Call = Callable[[int], object]
"""One logging call at a step."""
Session = Callable[[Path, str], contextlib.AbstractContextManager[Call]]
"""Sets an arm up in a scratch directory against the broker at the URL, yields its call, tears it down."""


def _loss(step: int) -> float:
    return 1.0 / (step + 1)


@contextlib.contextmanager
def agent_log(tmp: Path, url: str) -> Iterator[Call]:
    agent = trainvigil.init("compat-agent", config=None, nats_url=url)
    try:
        yield lambda step: agent.log(step, loss=_loss(step), lr=3e-4)
    finally:
        agent.close()


@contextlib.contextmanager
def ours_wandb(tmp: Path, url: str) -> Iterator[Call]:
    run = vigil_wandb.init(project="compat-bench", id="compat-wandb", vigil={"nats_url": url})
    try:
        yield lambda step: run.log({"train/loss": _loss(step), "lr": 3e-4}, step=step)
    finally:
        run.finish()


@contextlib.contextmanager
def real_wandb(tmp: Path, url: str) -> Iterator[Call]:
    folder = tmp / "wandb"
    folder.mkdir()
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        os.environ[var] = str(folder)
    for var, value in (("WANDB_SILENT", "true"), ("WANDB_CONSOLE", "off"), ("WANDB_DISABLE_GIT", "true"),
                       ("WANDB_DISABLE_CODE", "true"), ("WANDB_DISABLE_STATS", "true")):  # fmt: skip
        os.environ.setdefault(var, value)
    import wandb

    run = wandb.init(mode="offline", dir=str(folder), project="compat-bench")
    try:
        yield lambda step: run.log({"train/loss": _loss(step), "lr": 3e-4}, step=step)
    finally:
        run.finish()


@contextlib.contextmanager
def ours_tensorboard(tmp: Path, url: str) -> Iterator[Call]:
    writer = VigilWriter(run_id="compat-tensorboard", vigil={"nats_url": url})
    try:
        yield lambda step: writer.add_scalar("Loss/train", _loss(step), step)
    finally:
        writer.close()


@contextlib.contextmanager
def real_tensorboard(tmp: Path, url: str) -> Iterator[Call]:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp / "tensorboard"))
    try:
        yield lambda step: writer.add_scalar("Loss/train", _loss(step), step)
    finally:
        writer.close()


@dataclass(frozen=True)
class Arm:
    name: str
    session: Session
    requires: str = ""
    """The module a peer needs (``""``: ours, always timed)."""


ARMS = (
    Arm("agent.log (2 metrics)", agent_log),
    Arm("trainvigil.wandb.log", ours_wandb),
    Arm("wandb.log (offline)", real_wandb, "wandb"),
    Arm("trainvigil SummaryWriter.add_scalar", ours_tensorboard),
    Arm("TensorBoard SummaryWriter.add_scalar", real_tensorboard, "torch.utils.tensorboard"),
)
PAIRS = (("trainvigil.wandb.log", "wandb.log (offline)"),
         ("trainvigil SummaryWriter.add_scalar", "TensorBoard SummaryWriter.add_scalar"))  # fmt: skip
"""(drop-in, the library it stands in for)."""


def installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def time_calls(call: Call, first: int, calls: int) -> np.ndarray:
    """Nanoseconds of each of ``calls`` calls at steps ``first`` on."""
    samples = np.empty(calls, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(calls):
        start = clock()
        call(first + i)
        samples[i] = clock() - start
    return samples


def quantiles_us(samples: np.ndarray) -> tuple[float, float]:
    """(median, p99) in microseconds."""
    median, p99 = np.percentile(samples, [50, 99])
    return float(median) / 1000.0, float(p99) / 1000.0


def measure(calls: int, repeats: int) -> dict[str, np.ndarray | str]:
    """Every arm's pooled per-call samples (or why it was not timed), the arms taken in turn each round."""
    found: dict[str, np.ndarray | str] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="compat-bench-")))
        url = start_services(stack, tmp).url
        live: dict[str, Call] = {}
        for arm in ARMS:
            if arm.requires and not installed(arm.requires):
                found[arm.name] = "not installed (pip install 'trainvigil[bench]')"
                continue
            live[arm.name] = call = stack.enter_context(arm.session(tmp, url))
            time_calls(call, 0, WARMUP)
        rounds: dict[str, list[np.ndarray]] = {name: [] for name in live}
        for r in range(repeats):
            for name, call in live.items():
                rounds[name].append(time_calls(call, WARMUP + r * calls, calls))
        found.update({name: np.concatenate(parts) for name, parts in rounds.items()})
    return found


def report(found: dict[str, np.ndarray | str]) -> tuple[list[list[str]], list[str]]:
    """The table's rows, and the drop-ins that missed :data:`TARGET`."""
    rows, missed = [], []
    ours = {drop_in: library for drop_in, library in PAIRS}
    for name, samples in found.items():
        if isinstance(samples, str):
            rows.append([name, samples, "-", "-"])
            continue
        median, p99 = quantiles_us(samples)
        peer = found.get(ours.get(name, ""))
        ratio = "-"
        if isinstance(peer, np.ndarray):
            times = quantiles_us(peer)[0] / median
            ratio = f"{times:.0f}x"
            if times < TARGET:
                missed.append(f"{name}: {times:.1f}x cheaper than {ours[name]}, under the {TARGET:.0f}x target")
        rows.append([name, f"{median:.2f}", f"{p99:.2f}", ratio])
    return rows, missed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="timed calls per arm and round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds, each taking every arm in turn")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when a drop-in is under {TARGET:.0f}x")
    args = parser.parse_args(argv)
    rows, missed = report(measure(args.calls, args.repeats))
    print(f"{args.calls} calls x {args.repeats} rounds per arm, each call timed; microseconds a call")
    print(table(["call", "median us", "p99 us", "x cheaper than the library (median)"], rows))
    for line in missed:
        print(line)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
