"""Step events per second through every registered detector, on one core.

The workload is a backlog as the daemon fetches it: a supervised run on 8 ranks (loss,
grad_norm, lr, step_time, samples, tokens and the sparse checkpoint/eval tags: 8 metrics) and
two PPO-like runs on 2 ranks (reward, entropy, kl, response_len, loss, grad_norm, lr, step_time:
8 metrics), from ``traces``. Each batch holds chunk k (256 steps) of every one of the 12
streams, with heartbeats, as ``feed.batches`` builds them; batches are built before the clock
starts. The clock covers ``detectors.run_all`` over every batch with fresh detectors (the
median of ``--repeat`` passes); a second, instrumented pass times each detector's ``__call__``
alone (the per-stream grouping that detectors share is timed on its own row, first).

    python bench/detectors_throughput.py              # ~1.2 M steps, 3 passes
    python bench/detectors_throughput.py --quick      # ~0.3 M steps
    python bench/detectors_throughput.py --profile    # plus cProfile's top functions
    python bench/detectors_throughput.py --check      # exit 1 below 1 000 000 events/s

The process pins itself to one CPU (where the platform allows), so any helper threads share it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import statistics
import sys
import time
from typing import Any

import feed
import numpy as np
import traces
from tables import table

from trainvigil.daemon import detectors
from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.config import load
from trainvigil.daemon.detectors._series import streams

TARGET_EVENTS_PER_S = 1_000_000


def workload(steps: int, chunk: int) -> list[IngestBatch]:
    """Batches of chunk k of every stream of three runs (see the module docstring)."""
    runs = [traces.supervised(1, steps, 8, "sft")] + [traces.rl(2 + i, steps, 2, f"ppo-{i}") for i in range(2)]
    per_run = [list(feed.batches(t, chunk, gap_s=float("inf"), linger_s=0.0)) for t in runs]
    out = []
    for parts in zip(*per_run, strict=True):
        batch = IngestBatch(now=max(p.now or 0.0 for p in parts))
        for p in parts:
            batch.steps.extend(p.steps)
            batch.heartbeats.extend(p.heartbeats)
            batch.run_ends.extend(p.run_ends)
        out.append(batch)
    return out


def fresh(batches: list[IngestBatch]) -> None:
    """Drop what detectors cached on the batches in a previous pass."""
    for b in batches:
        b.cache.clear()


def timed_total(batches: list[IngestBatch], config: Any) -> tuple[float, int]:
    fresh(batches)
    dets = detectors.build(config.detectors)
    alerts = 0
    start = time.perf_counter()
    for batch in batches:
        alerts += len(detectors.run_all(dets, batch))
    return time.perf_counter() - start, alerts


def timed_each(batches: list[IngestBatch], config: Any) -> dict[str, float]:
    fresh(batches)
    dets = detectors.build(config.detectors)
    spent = dict.fromkeys(["(per-stream grouping)", *(d.name for d in dets)], 0.0)
    clock = time.perf_counter
    for batch in batches:
        t = clock()
        streams(batch)
        spent["(per-stream grouping)"] += clock() - t
        for d in dets:
            t = clock()
            d(batch)
            spent[d.name] += clock() - t
    return spent


def pin_one_core() -> str:
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    return "not pinned (no sched_setaffinity here)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000, help="steps per stream (12 streams)")
    parser.add_argument("--quick", action="store_true", help="25 000 steps per stream")
    parser.add_argument("--chunk", type=int, default=256, help="steps per stream per batch")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes (the median is reported)")
    parser.add_argument("--config", help="daemon TOML file whose [detectors.*] tables to use")
    parser.add_argument("--profile", action="store_true", help="also print cProfile's top functions")
    parser.add_argument("--check", action="store_true", help=f"exit 1 below {TARGET_EVENTS_PER_S:,} events/s")
    args = parser.parse_args(argv)
    steps = 25_000 if args.quick else args.steps
    config = load(args.config)
    pinned = pin_one_core()
    batches = workload(steps, args.chunk)
    events = sum(b.step_rows for b in batches)
    timed_total(batches[: len(batches) // 10], config)  # warm-up
    passes = [timed_total(batches, config) for _ in range(args.repeat)]
    total = statistics.median(p[0] for p in passes)
    spent = timed_each(batches, config)
    summed = sum(spent.values())

    shape = f"{events:,} step events, 12 streams, {args.chunk}-step chunks, {len(batches):,} batches"
    print(f"\n# Detector throughput: {shape}")
    load_avg = ", load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, {pinned}{load_avg}\n")
    rows: list[list[object]] = [
        [name, f"{1e3 * s:.1f}", f"{events / s:,.0f}" if s else "-", f"{100 * s / summed:.1f}%"]
        for name, s in spent.items()
    ]
    rows.append(["sum of the rows above (instrumented)", f"{1e3 * summed:.1f}", f"{events / summed:,.0f}", "100.0%"])
    best = min(p[0] for p in passes)
    rows.append([f"total: run_all, best of {args.repeat}", f"{1e3 * best:.1f}", f"{events / best:,.0f}", "-"])
    rows.append([f"total: run_all, median of {args.repeat}", f"{1e3 * total:.1f}", f"{events / total:,.0f}", "-"])
    print(table(["detector", "ms", "events/s", "share"], rows))
    print(f"\nalerts raised per pass: {passes[0][1]}")
    rate = events / total
    ok = rate >= TARGET_EVENTS_PER_S
    verdict = "PASS" if ok else "FAIL"
    print(f"target ≥ {TARGET_EVENTS_PER_S:,} events/s through all detectors (median): {rate:,.0f} -> {verdict}")
    if args.profile:
        fresh(batches)
        dets = detectors.build(config.detectors)
        profiler = cProfile.Profile()
        profiler.enable()
        for batch in batches:
            detectors.run_all(dets, batch)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        print("\n## cProfile, top 25 by own time\n")
        print(out.getvalue())
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
