"""Training processes for the ingest benches: one real agent each, logging 6 metrics per step.

Run as ``python bench/_agents.py RUN_ID URL STEPS [options]``: the process connects, prints
``ready``, waits for a line on stdin, logs, closes, and prints a :class:`ProducerResult` as JSON.
The bench's side (:func:`spawn_producers`, :func:`go`, :func:`collect`) drives a set of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from _procs import alive, spawn

from trainvigil.testing import wait_until

CONNECT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ProducerResult:
    """What a producer prints as its last stdout line (JSON), wall times from ``time.time()``."""

    run_id: str
    steps: int
    t_go: float
    t_logged: float
    t_closed: float
    cpu_s: float
    """CPU seconds of the whole producer process (training thread and agent worker) after go."""
    delivered: bool
    dropped: dict[str, int]


def log_flat_out(agent: Any, steps: int) -> None:
    log = agent.log
    for step in range(steps):
        log(step, loss=1.0 / (step + 1), grad_norm=1.5, lr=3e-4, step_time=0.25, samples=32 * step, tokens=65536 * step)


def log_paced(agent: Any, steps: int, rate_hz: float) -> np.ndarray:
    """Log at ``rate_hz``; returns each step's ``time.time()`` taken just before its ``log()``."""
    times = np.empty(steps, dtype=np.float64)
    log, period, start = agent.log, 1.0 / rate_hz, time.perf_counter()
    for step in range(steps):
        delay = start + step * period - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        times[step] = time.time()
        log(step, loss=1.0 / (step + 1), grad_norm=1.5, lr=3e-4, step_time=0.25, samples=32 * step, tokens=65536 * step)
    return times


def produce(argv: Sequence[str]) -> int:
    """``RUN_ID URL STEPS``: connect, print ``ready``, wait for a line on stdin, log, close."""
    parser = argparse.ArgumentParser(prog="_agents.py")
    parser.add_argument("run_id")
    parser.add_argument("url")
    parser.add_argument("steps", type=int)
    parser.add_argument("--rate", type=float, default=0.0, help="steps per second (0: as fast as possible)")
    parser.add_argument("--flush-interval", type=float, help="the agent's (default: its default)")
    parser.add_argument("--batch-size", type=int, help="the agent's (default: its default)")
    parser.add_argument("--times", type=Path, help="write each step's log() wall time here (.npy)")
    parser.add_argument("--spill-dir", type=Path, default=Path(tempfile.gettempdir()) / "trainvigil-spill")
    args = parser.parse_args(argv)
    import trainvigil

    options: dict[str, Any] = {"spill_dir": args.spill_dir}
    if args.flush_interval is not None:
        options["flush_interval"] = args.flush_interval
    if args.batch_size is not None:
        options["batch_size"] = args.batch_size
    agent = trainvigil.init(run_id=args.run_id, rank=0, nats_url=args.url, **options)
    try:
        wait_until(lambda: agent.stats()["connected"], CONNECT_TIMEOUT_S, "the agent to connect", 0.01)
    except TimeoutError:
        print(f"producer {args.run_id}: not connected to {args.url} after {CONNECT_TIMEOUT_S:g} s", file=sys.stderr)
        return 1
    print("ready", flush=True)
    sys.stdin.readline()
    t_go, cpu_go = time.time(), time.process_time()
    times: np.ndarray | None = None
    if args.rate > 0:
        times = log_paced(agent, args.steps, args.rate)
    else:
        log_flat_out(agent, args.steps)
    t_logged = time.time()
    delivered = agent.close(timeout=120)
    t_closed = time.time()
    if args.times is not None and times is not None:
        np.save(args.times, times)
    dropped = dict(agent.stats().get("dropped", {}))
    result = ProducerResult(
        args.run_id, args.steps, t_go, t_logged, t_closed, time.process_time() - cpu_go, delivered, dropped
    )
    print(json.dumps(asdict(result)), flush=True)
    return 0 if delivered else 1


# ---- the bench's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class Producer:
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def stdout(self) -> IO[bytes]:
        assert self.process.stdout is not None
        return self.process.stdout


def spawn_producers(stack: contextlib.ExitStack, tmp: Path, specs: list[list[str]]) -> list[Producer]:
    """One producer per spec (its arguments), each connected and waiting for go."""
    producers = []
    for i, spec in enumerate(specs):
        log = tmp / f"producer-{i}.log"
        argv = [sys.executable, __file__, *spec, "--spill-dir", str(tmp / "spill")]
        process = spawn(stack, argv, log, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        producers.append(Producer(process, log))
    for producer in producers:
        if producer.stdout.readline().strip() != b"ready":
            producer.process.wait(10)
            alive(producer.process, producer.log)
    return producers


def go(producers: list[Producer]) -> float:
    """Release every producer at once; returns the wall time of the release."""
    started = time.time()
    for producer in producers:
        assert producer.process.stdin is not None
        producer.process.stdin.write(b"go\n")
        producer.process.stdin.close()
    return started


def collect(producers: list[Producer], timeout: float = 150) -> list[ProducerResult]:
    results = []
    for producer in producers:
        line = producer.stdout.readline()
        if producer.process.wait(timeout) != 0 or not line:
            raise RuntimeError(f"producer failed ({producer.process.returncode}): {producer.log.read_text()[-2000:]}")
        results.append(ProducerResult(**json.loads(line)))
    return results


def check_producers(producers: list[Producer]) -> None:
    for producer in producers:
        if producer.process.poll() not in (None, 0):
            alive(producer.process, producer.log)


if __name__ == "__main__":
    sys.exit(produce(sys.argv[1:]))
