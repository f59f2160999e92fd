"""Ingest with 1 vs N daemon shards: steps/s, and what one shard costs per step (docs/operations/sizing.md's input).

For each shard count: a real nats-server (or a ``--nodes 3`` cluster on loopback with ``--replicas 3``
streams) with the subject mappings for that count, the shards' streams created as ``vigil up --shard``
creates them, then ``--agents`` producer processes (one run each, runs spread evenly over the shards)
log ``--steps`` steps each of 6 metrics into the streams while no daemon runs. Then every shard's
``vigil up --shard I/N --drain`` starts at once and runs to its exit: the clock runs from their start
to the last exit, and each shard's CPU seconds and peak RSS come from its own ``wait4``. Rows are
counted in each shard's DuckDB file afterwards (every step stored once, each run on one shard).

Draining a backlog measures the daemons alone: the agents are not competing for the CPU, and each
shard reads only its own stream. On a 2-core machine two shards share the cores with each other and
with nats-server, so the point is the mechanism and the per-shard cost (CPU µs per step), not a
speed-up; on a machine with a core per shard the rate adds up to the shards' own rates.

    python bench/cluster.py                       # 4 agents x 50 000 steps, 1 then 2 shards
    python bench/cluster.py --quick               # 2 agents x 5 000 steps
    python bench/cluster.py --nodes 3 --replicas 3
    python bench/cluster.py --batch-size 1 --steps 3000   # small messages: what a fleet at 1 step/s sends
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nats
from _agents import collect, go, spawn_producers
from _procs import daemon_argv, spawn, stored_rows

from trainvigil.daemon.broker.embedded import free_port
from trainvigil.daemon.broker.jetstream import ensure_stream
from trainvigil.daemon.config import load
from trainvigil.schemas.shards import shard_of
from trainvigil.testing import NatsCluster


@dataclass(frozen=True)
class ShardRun:
    shard: str
    steps: int
    wall_s: float
    cpu_s: float
    peak_rss_mib: float


@dataclass(frozen=True)
class Result:
    shards: int
    steps: int
    fill_s: float
    drain_s: float
    per_shard: list[ShardRun]
    idle_s: float
    """The same shards' ``--drain`` on empty streams: start-up, connect, checks, exit."""
    idle_cpu_s: float
    messages: int
    """Messages the agents' steps (and runs' start, end, heartbeats) took in the streams."""
    stream_bytes: int
    """What they held in the streams before the drain (one replica)."""
    db_bytes: int
    """The shards' DuckDB files after the drain."""

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.drain_s

    @property
    def net_steps_per_s(self) -> float | None:
        """Without the start-up and exit an empty drain takes (None: the drain was within its noise)."""
        net = self.drain_s - self.idle_s
        return self.steps / net if net > 0.5 else None

    @property
    def cpu_us_per_step(self) -> float:
        """Daemon CPU per stored step, without what an empty drain costs."""
        return 1e6 * max(sum(s.cpu_s for s in self.per_shard) - self.idle_cpu_s, 0.0) / self.steps


def balanced_runs(agents: int, shards: int) -> list[str]:
    """``agents`` run ids, as evenly spread over the shards as the broker's hash allows."""
    wanted = [agents // shards + (1 if i < agents % shards else 0) for i in range(shards)]
    runs: list[str] = []
    for k in itertools.count():
        run_id = f"bench-{k}"
        home = shard_of(run_id, shards)
        if wanted[home]:
            wanted[home] -= 1
            runs.append(run_id)
        if len(runs) == agents:
            return runs
    raise AssertionError("unreachable")


async def _stream_usage(urls: list[str], shards: int) -> tuple[int, int]:
    """Messages and bytes the shards' streams hold (on one node: a replica count times that on disk)."""
    nc = await nats.connect(urls)
    try:
        js, messages, size = nc.jetstream(), 0, 0
        for i in range(shards):
            state = (
                await js.stream_info(
                    load(env={"VIGIL_SHARD": f"{i}/{shards}", "VIGIL_NATS_URL": urls[0]}).for_shard().stream.name
                )
            ).state
            messages, size = messages + state.messages, size + state.bytes
        return messages, size
    finally:
        await nc.close()


async def _create_streams(urls: list[str], shards: int, replicas: int) -> None:
    """Every shard's stream, as ``vigil up --shard I/N`` creates it."""
    nc = await nats.connect(urls)
    try:
        js = nc.jetstream()
        for i in range(shards):
            env = {
                "VIGIL_SHARD": f"{i}/{shards}",
                "VIGIL_NATS_URL": ",".join(urls),
                "VIGIL_STREAM_REPLICAS": str(replicas),
            }
            cfg = load(env=env).for_shard()
            await ensure_stream(js, cfg.stream, cfg.stream_subjects)
    finally:
        await nc.close()


def _drain_all(
    stack: contextlib.ExitStack, tmp: Path, url: str, shards: int, replicas: int
) -> tuple[float, list[tuple[float, float, float]]]:
    """Every shard's ``vigil up --drain`` at once, to the last exit: (wall s, [(wall s, CPU s, peak RSS MiB)])."""
    env = {**os.environ, "VIGIL_LOG_LEVEL": "warning", "VIGIL_STREAM_REPLICAS": str(replicas)}
    started = time.monotonic()
    daemons = {}
    for i in range(shards):
        argv = daemon_argv(url, tmp / f"s{i}", free_port(), "--shard", f"{i}/{shards}", "--drain")
        daemons[i] = spawn(stack, argv, tmp / f"s{i}.log", stdout=subprocess.DEVNULL, env=env)
    ended: dict[int, tuple[float, float, float]] = {}
    while len(ended) < shards:
        for i, proc in daemons.items():
            if i in ended:
                continue
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                if proc.returncode != 0:
                    raise RuntimeError(f"shard {i} exited {proc.returncode}: {(tmp / f's{i}.log').read_text()[-2000:]}")
                ended[i] = (time.monotonic() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)
        time.sleep(0.02)
    return max(e[0] for e in ended.values()), [ended[i] for i in range(shards)]


def run(shards: int, agents: int, steps: int, nodes: int, replicas: int, batch_size: int | None = None) -> Result:
    """One shard count: fill the streams with ``agents`` x ``steps`` (``batch_size`` steps per message at most),
    then drain them with every shard at once; every row is checked in its shard's file."""
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        cluster = NatsCluster(tmp / "nats", nodes=nodes, shards=shards)
        stack.callback(cluster.stop)
        cluster.start()
        asyncio.run(_create_streams(cluster.urls, shards, replicas))
        # The same daemons on the empty streams first: their start-up and exit, taken off below.
        idle_s, idle = _drain_all(stack, tmp, cluster.url, shards, replicas)
        runs = balanced_runs(agents, shards)
        extra = ["--batch-size", str(batch_size)] if batch_size else []
        producers = spawn_producers(stack, tmp, [[run_id, cluster.url, str(steps), *extra] for run_id in runs])
        t0 = go(producers)
        results = collect(producers, timeout=3600)
        if any(not r.delivered or r.dropped for r in results):
            raise RuntimeError(f"agents dropped or did not deliver: {results}")
        fill_s = max(r.t_closed for r in results) - t0
        messages, stream_bytes = asyncio.run(_stream_usage(cluster.urls, shards))
        drain_s, ended = _drain_all(stack, tmp, cluster.url, shards, replicas)
        per_shard = []
        for i, (wall, cpu, rss) in enumerate(ended):
            stored = stored_rows(tmp / f"s{i}" / "vigil.duckdb")
            expected = steps * sum(1 for r in runs if shard_of(r, shards) == i)
            if stored.rows != expected or stored.distinct != stored.rows:
                raise RuntimeError(f"shard {i}/{shards} stored {stored} rows, expected {expected} once each")
            per_shard.append(ShardRun(f"{i}/{shards}", stored.rows, wall, cpu, rss))
        db_bytes = sum((tmp / f"s{i}" / "vigil.duckdb").stat().st_size for i in range(shards))
        idle_cpu = sum(cpu for _, cpu, _ in idle)
        return Result(
            shards, agents * steps, fill_s, drain_s, per_shard, idle_s, idle_cpu, messages, stream_bytes, db_bytes
        )


def format_results(results: list[Result], nodes: int, replicas: int, batch_size: int | None) -> str:
    per_message = f"at most {batch_size} steps per message" if batch_size else "the agent's batching"
    lines = [
        f"NATS: {nodes} node(s), streams R{replicas}; {per_message}; {os.cpu_count()} CPUs",
        "",
        "| shards | steps | messages | fill s | drain s (empty) | steps/s | net steps/s | daemon CPU µs/step"
        " (net) | stream B/msg | DuckDB B/step | per shard: steps, wall s, CPU s, peak RSS MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|",
    ]
    for r in results:
        shards = "; ".join(
            f"{s.shard}: {s.steps}, {s.wall_s:.1f}, {s.cpu_s:.1f}, {s.peak_rss_mib:.0f}" for s in r.per_shard
        )
        net = "n/a" if r.net_steps_per_s is None else f"{r.net_steps_per_s:,.0f}"
        lines.append(
            f"| {r.shards} | {r.steps} | {r.messages} | {r.fill_s:.1f} | {r.drain_s:.1f} ({r.idle_s:.1f}) "
            f"| {r.steps_per_s:,.0f} | {net} | {r.cpu_us_per_step:.1f} | {r.stream_bytes / max(r.messages, 1):.0f} "
            f"| {r.db_bytes / r.steps:.1f} | {shards} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument(
        "--batch-size",
        type=int,
        help="steps per message at most (default: the agent's, 8192); 1 = a rank at 1 step/s, one message per step",
    )
    parser.add_argument("--quick", action="store_true", help="2 agents x 5 000 steps")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.steps = 2, 5_000
    results = [run(n, args.agents, args.steps, args.nodes, args.replicas, args.batch_size) for n in args.shards]
    print(format_results(results, args.nodes, args.replicas, args.batch_size))


if __name__ == "__main__":
    main()
