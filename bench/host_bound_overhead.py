"""What the agent costs a training thread that holds the GIL: the host side of a GPU step, side by side in one process.

On a GPU the training thread spends its step in Python and kernel launches, holding the GIL, and
the agent's thread has to take the GIL from it at each of its wake-ups (a flush every flush interval, an
ack, a heartbeat). On a CPU step the torch kernels release the GIL while they compute, which
hides that; this bench does not. The step here is ~2 ms of pure Python (``--work``:
``allocating`` makes an int per iteration, as Python code does; ``flat`` allocates nothing).

Within one process, blocks of ``--block`` seconds alternate, in random order per pair: one with
an agent started (connected and settled first, then closed after the block) that logs 3 metrics
per step (``idle`` rows: logs nothing), one with no agent at all. Blocks within one process
compare to ~1 %, where whole processes differ by ±5 % in Python speed (memory layout). Each row
runs in its own process, on ``cpus``: ``1`` is the training's core shared with the agent's thread
(a job whose cores are all busy, or a rank pinned to one core), ``2`` leaves the scheduler a second
core (on a 2-core machine, the one nats-server and the daemon are pinned to). Two reference rows run
no agent but a thread that wakes 4 times a second for ~1 ms of CPU, of varied library code or of one
tight loop: whether the machine slows a GIL-bound thread for code that merely shares its core.

    python bench/host_bound_overhead.py                # --pairs 20 --block 1 (~6 min)
    python bench/host_bound_overhead.py --only 1 --only 5 --only 6 --pairs 40

Printed per row: median step without and with, the median over pairs of the blocks' median-step
ratio with a bootstrap 95 % interval, the mean-step ratio, and the training thread's involuntary
context switches per second with the agent (without it: ~2).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _procs import start_services
from _stats import median_interval
from tables import table

ROWS = (
    # (label, cpus, work, beside: what runs beside the training thread in the "with" blocks)
    ("agent logging, shared core", 1, "allocating", "logging"),
    ("agent idle, shared core", 1, "allocating", "idle"),
    ("agent logging, shared core, flat work", 1, "flat", "logging"),
    ("agent logging, 2 cores", 2, "allocating", "logging"),
    ("no agent: 1 ms of varied Python 4x/s, shared core", 1, "allocating", "varied"),
    ("no agent: 1 ms of a tight loop 4x/s, shared core", 1, "allocating", "tight"),
)
"""The last two rows are references without trainvigil: a thread that wakes as often as the agent and
works about as long, on varied library code (json, re, textwrap, difflib, decimal) or on one tight loop."""


def _work(kind: str, n: int) -> Any:
    """A step of pure Python: ``allocating`` makes and drops an int per iteration, ``flat`` reuses small ints."""
    if kind == "flat":
        small = [i & 127 for i in range(n)]

        def flat() -> int:
            s = 0
            for x in small:
                s = (s + x) & 255
            return s

        return flat

    def allocating() -> int:
        s = 0
        for i in range(n):
            s += i * i % 7
        return s

    return allocating


def _burst(kind: str) -> Any:
    """About 1 ms of this thread's CPU: varied library code, or one tight loop."""
    import decimal
    import difflib
    import fractions
    import re
    import textwrap

    doc = {f"k{i}": [i, str(i), {"x": float(i)}] for i in range(40)}

    def varied() -> None:
        json.loads(json.dumps(doc))
        re.sub(r"(\d+)", "n", "abc 123 def 456")
        textwrap.fill("word " * 40, 30)
        difflib.SequenceMatcher(None, "abcdefgh", "abxdefzh").ratio()
        _ = decimal.Decimal("1.1") * 3, fractions.Fraction(3, 7) + 1

    def tight() -> None:
        x = 0
        for i in range(200):
            x += i

    body = varied if kind == "varied" else tight

    def burst() -> None:
        end = time.thread_time() + 0.001
        while time.thread_time() < end:
            body()

    return burst


class Beside:
    """What runs beside the training thread in a "with" block: an agent, or a reference thread."""

    def __init__(self, kind: str, run_id: str) -> None:
        self.kind = kind
        self.agent: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        if kind in ("logging", "idle"):
            import trainvigil

            self.agent = trainvigil.init(run_id=run_id)
            self.agent.flush(10)
        else:
            burst = _burst(kind)

            def wake_and_work() -> None:
                try:
                    while not self._stop.wait(0.25):
                        burst()
                except BaseException as exc:  # a reference row that stopped working must not read as "no cost"
                    self.error = exc

            self._thread = threading.Thread(target=wake_and_work, daemon=True)
            self._thread.start()

    def log(self, step: int) -> None:
        if self.kind == "logging":
            self.agent.log(step, loss=1.0 / step, step_time=0.002, samples=float(step))

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"the {self.kind} thread failed: {self.error!r}")


def _switches() -> int:
    """Involuntary context switches of the calling thread so far."""
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith("nonvoluntary_ctxt_switches"):
            return int(line.split()[1])
    return 0


def child(args: argparse.Namespace) -> None:
    """One row: the blocks, printed as one JSON line."""
    step_fn = _work(args.work, args.n)
    rng = random.Random(0)
    rows: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    step = 0
    for pair in range(args.pairs):
        order = [True, False]
        rng.shuffle(order)
        for with_it in order:
            beside = Beside(args.beside, f"host-bound-{os.getpid()}-{pair}") if with_it else None
            time.sleep(args.settle)  # the agent's start-up (connect, first heartbeat) is not the step's
            gaps = []
            switches = _switches()
            start = last = time.perf_counter()
            while last - start < args.block:
                step_fn()
                step += 1
                if beside is not None:
                    beside.log(step)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
            rate = (_switches() - switches) / (last - start)
            if beside is not None:
                beside.close()
            rows[with_it].append((statistics.median(gaps), (last - start) / len(gaps), rate))
    print(json.dumps({"with": rows[True], "without": rows[False]}))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20, help="pairs of blocks per row")
    parser.add_argument("--block", type=float, default=1.0, help="seconds per block")
    parser.add_argument("--settle", type=float, default=0.5, help="seconds before each block")
    parser.add_argument("--n", type=int, default=60_000, help="iterations per step (~2 ms)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", choices=("allocating", "flat"), default="allocating", help=argparse.SUPPRESS)
    parser.add_argument("--beside", default="logging", help=argparse.SUPPRESS)
    parser.add_argument("--only", type=int, action="append", help="row numbers (1-based) to run (repeatable)")
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("needs 2 CPUs: one for nats-server and the daemon, one for the training", file=sys.stderr)
        return 2
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-host-bound-") as name, contextlib.ExitStack() as stack:
        svc = start_services(stack, Path(name))
        svc.pin(cpus[-1])
        env = {**os.environ, "VIGIL_NATS_URL": svc.url, "VIGIL_LOG_LEVEL": "warning"}
        for k, (label, ncpus, work, beside) in enumerate(ROWS, 1):
            if args.only and k not in args.only:
                continue
            mine = {cpus[0]} if ncpus == 1 else {cpus[0], cpus[-1]}
            argv = [sys.executable, __file__, "--child", "--work", work, "--beside", beside,
                    "--pairs", str(args.pairs), "--block", str(args.block), "--settle", str(args.settle),
                    "--n", str(args.n)]  # fmt: skip
            print(f"  {label}: training on cpus {sorted(mine)}, {args.pairs} pairs ...", flush=True)
            done = subprocess.run(
                argv,
                env=env,
                capture_output=True,
                text=True,
                timeout=3600,
                preexec_fn=functools.partial(os.sched_setaffinity, 0, mine),
            )
            if done.returncode != 0:
                raise RuntimeError(f"{label} failed: {done.stderr[-2000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            with_, without = result["with"], result["without"]
            medians = [w[0] / o[0] for w, o in zip(with_, without, strict=True)]
            means = [w[1] / o[1] for w, o in zip(with_, without, strict=True)]
            low, high = median_interval(medians)
            out.append((
                label, f"{1e3 * statistics.median(o[0] for o in without):.3f}",
                f"{1e3 * statistics.median(w[0] for w in with_):.3f}", f"{statistics.median(medians):.3f}x",
                f"{low:.3f}-{high:.3f}", f"{statistics.median(means):.3f}x",
                f"{statistics.median(w[2] for w in with_):.0f}", f"{statistics.median(o[2] for o in without):.0f}",
            ))  # fmt: skip
    print()
    header = ("row", "step ms without", "step ms with", "median-step ratio", "95 % interval", "mean-step ratio",
              "switches/s with", "switches/s without")  # fmt: skip
    print(table(header, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
