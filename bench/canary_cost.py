"""What canaries cost: CPU seconds and wall time per canary kind, and the daemon's ingest rate with a canary
running beside it vs without, in one run on one daemon.

**Per kind**: a nats-server and ``vigil up`` (real processes, temporary store), then
``vigil canary run --all`` (or, for ``--faults K,...``, ``vigil canary run --fault K`` for each kind, one
after another). A canary's job is a child of the daemon (its own process group, reaped by the daemon), so
the job's CPU, with that of the ranks it started and waited for, is the growth of the daemon's
``cutime + cstime`` (``/proc/<pid>/stat``) across the canary; the daemon's own CPU for it (ingest,
detectors, judging) is the growth of its ``utime + stime``. With ``--all`` the canaries run one after
another and each verdict line comes once its job was reaped, so the counters are read at each verdict
line. Wall time is the verdict's ``duration_s`` (launch to verdict).

**Ingest with a canary**: N agents log S steps of 6 metrics flat out (``ingest.py``'s throughput phase:
the clock stops when the daemon committed every row), twice on the same daemon: alone, then with a clean
``supervised`` canary running beside them (at the canary niceness, started and logging before the agents
are released). The ratio is steps/s with a canary over steps/s without.

    python bench/canary_cost.py                       # every fault kind + clean twin, then the ingest ratio
    python bench/canary_cost.py --faults nan_grad,gil --agents 2 --steps 100000
    python bench/canary_cost.py --skip-ingest
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _procs import Services, children_cpu_seconds, cpu_seconds, spawn, start_services
from ingest import Throughput, throughput_phase
from tables import table

from trainvigil.schemas.canaries import CLEAN, FAULT_KINDS
from trainvigil.testing import scrape, steps_committed, wait_until

RUNNING_SERIES = "vigil_canaries_running"
VERDICT_LINE = re.compile(r"^vigil: (?P<run_id>canary-\S+): (?P<verdict>pass|fail|error|aborted): ")
CANARY_TIMEOUT_S = 900.0
INGEST_CANARY_STEPS = 1_000_000
"""The ingest phase's canary: a clean twin far longer than the phase, aborted when the daemon stops."""


@dataclass(frozen=True)
class Cost:
    fault: str
    workload: str
    verdict: str
    fired: str
    latency: str
    wall_s: float
    job_cpu_s: float
    daemon_cpu_s: float


def vigil(svc: Services, *args: str) -> list[str]:
    where = ["--nats", svc.url, "--data-dir", str(svc.db_path.parent)]
    return [sys.executable, "-m", "trainvigil.daemon.cli", "canary", "run", *args, *where]


def one_canary(svc: Services, fault: str, extra: Sequence[str]) -> Cost:
    """Run one canary through the daemon; its cost from the daemon's CPU counters around it."""
    pid = svc.daemon.pid
    job_before, daemon_before = children_cpu_seconds(pid), cpu_seconds(pid)
    done = subprocess.run(
        vigil(svc, "--fault", fault, "--format", "json", *extra),
        capture_output=True,
        text=True,
        timeout=CANARY_TIMEOUT_S,
    )
    job_cpu, daemon_cpu = children_cpu_seconds(pid) - job_before, cpu_seconds(pid) - daemon_before
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise RuntimeError(f"vigil canary run --fault {fault} exited {done.returncode}: {done.stderr[-2000:]}")
    return cost_of(json.loads(done.stdout), job_cpu, daemon_cpu)


def cost_of(result: dict[str, Any], job_cpu: float, daemon_cpu: float) -> Cost:
    steps, seconds = result.get("latency_steps"), result.get("latency_s")
    latency = " / ".join(
        part for part in (f"{steps} steps" if steps is not None else "", f"{seconds:.1f} s" if seconds else "") if part
    )
    return Cost(
        fault=result["fault"],
        workload=result["workload"],
        verdict=result["verdict"],
        fired=result.get("fired_detector") or "-",
        latency=latency or "-",
        wall_s=float(result["duration_s"]),
        job_cpu_s=job_cpu,
        daemon_cpu_s=daemon_cpu,
    )


def every_canary(svc: Services, extra: Sequence[str]) -> list[Cost]:
    """``vigil canary run --all``: the canaries run one after another, and each verdict line is printed once
    its job was reaped, so the daemon's CPU counters between two verdict lines are that canary's."""
    pid = svc.daemon.pid
    job_mark, daemon_mark = children_cpu_seconds(pid), cpu_seconds(pid)
    spent: dict[str, tuple[float, float]] = {}
    cli = subprocess.Popen(vigil(svc, "--all", "--format", "json", *extra), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert cli.stderr is not None and cli.stdout is not None
    said = []
    for line in cli.stderr:
        said.append(line)
        verdict = VERDICT_LINE.match(line)
        if verdict is None:
            continue
        job, daemon = children_cpu_seconds(pid), cpu_seconds(pid)
        spent[verdict["run_id"]] = (job - job_mark, daemon - daemon_mark)
        job_mark, daemon_mark = job, daemon
        print(f"  {line.strip()[:150]}", flush=True)
    out = cli.stdout.read()
    if cli.wait(CANARY_TIMEOUT_S) not in (0, 1) or not out.strip():
        raise RuntimeError(f"vigil canary run --all exited {cli.returncode}: {''.join(said)[-2000:]}")
    results = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [cost_of(r, *spent.get(r["run_id"] if "run_id" in r else r["name"], (math.nan, math.nan))) for r in results]


@dataclass(frozen=True)
class IngestRatio:
    alone_steps_per_s: float
    beside_steps_per_s: float
    canary_cpu_s: float
    """The canary job's CPU during the phase beside it (from /proc/<job pid>/stat, sampled)."""

    @property
    def ratio(self) -> float:
        return self.beside_steps_per_s / self.alone_steps_per_s


def _job_pids(daemon_pid: int) -> list[int]:
    """The daemon's child processes but nats-server's (the canary jobs it runs)."""
    children = Path(f"/proc/{daemon_pid}/task/{daemon_pid}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def ingest_ratio(
    stack: contextlib.ExitStack, tmp: Path, svc: Services, agents: int, steps: int, repeats: int
) -> IngestRatio:
    """``repeats`` phases alone, then ``repeats`` beside the canary; the medians of their rates."""
    alone = [throughput_phase(stack, tmp, svc, agents, steps) for _ in range(repeats)]
    before = steps_committed(svc.http_port)
    spawn(stack, vigil(svc, "--fault", CLEAN, "--steps", str(INGEST_CANARY_STEPS)), tmp / "canary-cli.log",
          stdout=subprocess.DEVNULL)  # fmt: skip

    def logging() -> bool:
        return scrape(svc.http_port).get(RUNNING_SERIES, 0) >= 1 and steps_committed(svc.http_port) > before + 500

    wait_until(logging, 120, "the canary to run and log")
    jobs = _job_pids(svc.daemon.pid)
    job_cpu = sum(cpu_seconds(p) for p in jobs)
    beside = [throughput_phase(stack, tmp, svc, agents, steps) for _ in range(repeats)]
    job_cpu = sum(cpu_seconds(p) for p in jobs if Path(f"/proc/{p}").exists()) - job_cpu
    return IngestRatio(_median_rate(alone), _median_rate(beside), job_cpu)


def _median_rate(phases: list[Throughput]) -> float:
    return statistics.median(t.total / t.wall_s for t in phases)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--faults", default="all", help=f"comma-separated kinds (default all: {', '.join(FAULT_KINDS)}, {CLEAN})"
    )
    parser.add_argument("--steps", type=int, help="--steps of each canary (default: its workload's)")
    parser.add_argument("--fault-step", type=int, help="--fault-step of each canary (default: its workload's)")
    parser.add_argument("--agents", type=int, default=4, help="agents in the ingest phase")
    parser.add_argument("--ingest-steps", type=int, default=200_000, help="steps each agent logs in the ingest phase")
    parser.add_argument("--repeats", type=int, default=3, help="ingest phases alone, then as many beside the canary")
    parser.add_argument("--skip-ingest", action="store_true", help="only the per-kind costs")
    parser.add_argument("--skip-kinds", action="store_true", help="only the ingest ratio")
    args = parser.parse_args(argv)
    kinds = [*FAULT_KINDS, CLEAN] if args.faults == "all" else [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in (*FAULT_KINDS, CLEAN)]
    if unknown:
        parser.error(f"unknown fault kinds: {', '.join(unknown)}")
    args.kinds = kinds
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    extra = [
        *(["--steps", str(args.steps)] if args.steps else []),
        *(["--fault-step", str(args.fault_step)] if args.fault_step else []),
    ]
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs; canaries one at a time on one daemon", flush=True
    )
    costs: list[Cost] = []
    with tempfile.TemporaryDirectory(prefix="bench-canary-") as name, contextlib.ExitStack() as stack:
        tmp = Path(name)
        svc = start_services(stack, tmp)
        if not args.skip_kinds:
            began = time.monotonic()
            if args.faults == "all":
                costs = every_canary(svc, extra)
            for kind in [] if args.faults == "all" else args.kinds:
                cost = one_canary(svc, kind, extra)
                costs.append(cost)
                print(f"  {kind}: {cost.verdict} in {cost.wall_s:.1f} s, job {cost.job_cpu_s:.1f} CPU s", flush=True)
            total = time.monotonic() - began
        ratio = None
        if not args.skip_ingest:
            ratio = ingest_ratio(stack, tmp, svc, args.agents, args.ingest_steps, args.repeats)
    if costs:
        print()
        rows = [
            (c.workload, c.fault, c.verdict, c.fired, c.latency, f"{c.wall_s:.1f}", f"{c.job_cpu_s:.1f}",
             f"{c.daemon_cpu_s:.1f}", f"{c.job_cpu_s / c.wall_s:.2f}")
            for c in costs
        ]  # fmt: skip
        headers = (
            "workload",
            "fault",
            "verdict",
            "caught by",
            "latency",
            "wall s",
            "job CPU s",
            "daemon CPU s",
            "job cores",
        )
        print(table(headers, rows))
        how = "vigil canary run --all" if args.faults == "all" else f"{len(costs)} canaries one after another"
        print(f"\n{how}: {total:.0f} s "
              f"({sum(c.wall_s for c in costs):.0f} s of canary wall time), "
              f"{sum(c.verdict == 'pass' for c in costs)} passed")  # fmt: skip
    if ratio is not None:
        print()
        beside = f"beside a clean supervised canary (it took {ratio.canary_cpu_s:.1f} CPU s meanwhile)"
        ingest_rows = [
            ("alone", f"{ratio.alone_steps_per_s:,.0f}"),
            (beside, f"{ratio.beside_steps_per_s:,.0f}"),
            ("ratio (beside / alone)", f"{ratio.ratio:.2f}x"),
        ]
        what = f"ingest, {args.agents} agents x {args.ingest_steps:,} steps (median of {args.repeats})"
        print(table((what, "steps/s"), ingest_rows))
    return 0 if all(c.verdict == "pass" for c in costs) else 1


if __name__ == "__main__":
    sys.exit(main())
