"""Honest evaluation of the streaming detectors: synthetic training traces, injected faults, held-out seeds.

Clean traces (``traces.supervised`` / ``traces.rl``) look like real training; ``traces.FAULTS``
puts one fault per trace at a random step, at several sizes. Each trace goes through a fresh
set of detectors exactly as live ingest feeds them (``feed.batches``: IngestBatches built with
``trainvigil.daemon.batch.from_arrays``, 256-step chunks, chunk k of every rank before chunk k+1,
``batch.now`` = the batch's latest step time, idle ticks through silences, heartbeats,
``RunEnd``), built with ``detectors.build(config.detectors)`` from ``trainvigil.daemon.config.load``.

Per detector x fault x size it prints:

* recall: faults whose expected detector opened an episode on an affected rank within the
  fault's horizon (``[step, step + horizon]``);
* latency p50/p95 in steps: that episode's step minus the fault step (for ``stall``, also
  seconds from the last step before the silence to the alert);
* in budget: detections within the detector's latency target (NaN: 0 steps; x10 and x100 grad
  spikes: 1 step; slowdowns ≥ 1.3x: 2 windows of max(50 steps, 60 s));
* precision: episodes (any detector) in those traces that match the fault (its expected
  detector or one that may rightly fire too, on an affected rank, in its horizon, or any time
  after a persistent fault) over all episodes opened in those traces.

and per detector the false-positive episodes per 100 000 clean steps (step rows over all
ranks), for supervised and RL traces apart. Targets get PASS/FAIL.

Seeds: the ``calib`` and ``heldout`` splits draw disjoint seeds. Tune on ``--split calib``
(or let ``--sweep`` pick a value there), report on ``heldout`` (the default)::

    python bench/detectors_eval.py --quick      # 0.3 M clean steps, 5 traces per fault size: ~1.6 M steps
    python bench/detectors_eval.py              # full: 2.9 M clean steps, 30 per fault size: ~11 M steps
    python bench/detectors_eval.py --config vigil.toml --split calib
    python bench/detectors_eval.py --sweep grad_spike.warn_z=5,6,7 --sweep slowdown.warn=0.8,0.85

A ``--sweep`` runs only that detector with each value over the calibration seeds, keeps the
value with the best mean recall whose false-positive rate meets the target (else the quietest),
and reports on the held-out seeds with the chosen values. Detectors that are not registered
yet just have no rows.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import feed
import msgspec
import numpy as np
import traces
from tables import table

from trainvigil.daemon import detectors
from trainvigil.daemon.config import DaemonConfig, load

TARGET_FP_PER_100K = 1.0
FAULT_AFTER = {"supervised": 1000, "rl": 400}
"""Faults land after this many steps: every detector is past its warm-up."""

Variant = Callable[[], detectors.Detectors]
"""A fresh set of detectors (one per trace)."""


@dataclass(frozen=True)
class Plan:
    """How many traces of what length: (traces, steps per rank, ranks)."""

    clean_supervised: tuple[int, int, int]
    clean_rl: tuple[int, int, int]
    per_fault: int
    supervised: tuple[int, int] = (4500, 2)
    """(steps, ranks) of a faulted supervised trace (straggler traces get 4 ranks)."""
    rl: tuple[int, int] = (2000, 2)


QUICK = Plan(clean_supervised=(6, 10000, 4), clean_rl=(6, 5000, 2), per_fault=5)
FULL = Plan(clean_supervised=(24, 20000, 4), clean_rl=(50, 10000, 2), per_fault=30)


def seed_of(split: str, name: str, i: int) -> int:
    """Disjoint, stable seeds per split, trace family and index."""
    return zlib.crc32(f"{split}/{name}/{i}".encode())


# ----------------------------------------------------------------------------------------------- running


@dataclass(frozen=True, slots=True)
class Opened:
    """An alert episode as it opened."""

    detector: str
    rank: int
    step: int
    time: float


def run(trace: traces.Trace, batches: list[Any], dets: detectors.Detectors) -> list[Opened]:
    """Feed ``batches`` (of ``trace``) through ``dets``; the episodes that opened."""
    wall = trace.ranks[0].time
    out = []
    for batch in batches:
        for a in detectors.run_all(dets, batch):
            if a.state == "open":
                # An alert without a step (none yet) is placed at the last step logged before it.
                step = a.step if a.step is not None else max(0, int(np.searchsorted(wall, a.time, "right")) - 1)
                out.append(Opened(a.detector, a.rank, int(step), float(a.time)))
    return out


@dataclass
class Row:
    """One fault kind at one size."""

    detector: str
    faults: int = 0
    latencies: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    budgeted: int = 0
    in_budget: int = 0
    episodes: int = 0
    matched: int = 0
    misses: list[str] = field(default_factory=list)
    """One line per fault missed or detected past its budget."""


@dataclass
class Tally:
    """One variant's results on one split."""

    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    clean_rows: Counter[str] = field(default_factory=Counter)
    clean_episodes: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    faulted: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))


def matches(o: Opened, f: traces.Fault) -> bool:
    """Whether episode ``o`` is an answer to fault ``f``."""
    if (o.detector != f.detector and o.detector not in f.also) or o.rank not in f.ranks:
        return False
    return o.step >= f.step - f.lead and (f.persistent or o.step <= f.step + f.horizon)


def judge(trace: traces.Trace, kind: traces.FaultKind, opened: list[Opened], tally: Tally) -> None:
    f = trace.fault
    assert f is not None
    row = tally.rows.setdefault((kind.kind, kind.size), Row(kind.detector))
    row.faults += 1
    hits = [
        o
        for o in opened
        if o.detector == f.detector and o.rank in f.ranks and f.step - f.lead <= o.step <= f.step + f.horizon
    ]
    latency = None
    if hits:
        first = min(hits, key=lambda o: (o.step, o.time))
        latency = max(0, first.step - f.step)
        row.latencies.append(latency)
        row.seconds.append(first.time - float(trace.ranks[0].time[f.step - f.lead]))
    if f.budget is not None:
        row.budgeted += 1
        row.in_budget += latency is not None and latency <= f.budget
    if latency is None or (f.budget is not None and latency > f.budget):
        found = "missed" if latency is None else f"latency {latency} steps"
        budget = "" if f.budget is None else f" (budget {f.budget})"
        row.misses.append(
            f"{trace.run_id} seed {trace.seed}: fault at step {f.step} on rank(s) {list(f.ranks)}, {found}{budget}, "
            f"base step time {trace.base_step_time:.2f} s; episodes: {_describe(opened)}"
        )
    for o in opened:
        hit = matches(o, f)
        row.episodes += 1
        row.matched += hit
        count = tally.faulted[o.detector]
        count["episodes"] += 1
        count["matched"] += hit
        count["before"] += o.step < f.step - f.lead
        if not hit and o.step >= f.step - f.lead:
            count[f"after {kind.kind}"] += 1


def _describe(opened: list[Opened]) -> str:
    return (
        ", ".join(f"{o.detector}@{o.step}/r{o.rank}" for o in opened[:8]) + (" ..." if len(opened) > 8 else "")
        or "none"
    )


def clean_traces(split: str, plan: Plan) -> Iterator[traces.Trace]:
    for kind, (count, steps, ranks), make in (
        ("supervised", plan.clean_supervised, traces.supervised),
        ("rl", plan.clean_rl, traces.rl),
    ):
        for i in range(count):
            yield make(seed_of(split, f"clean-{kind}", i), steps, ranks, f"{split}-clean-{kind}-{i}")


def fault_traces(split: str, plan: Plan, kind: traces.FaultKind) -> Iterator[traces.Trace]:
    steps, ranks = plan.supervised if kind.trace == "supervised" else plan.rl
    if kind.kind == "straggler":
        ranks = 4
    make = traces.supervised if kind.trace == "supervised" else traces.rl
    name = f"{kind.kind}-{kind.size}"
    for i in range(plan.per_fault):
        seed = seed_of(split, name, i)
        clean = make(seed, steps, ranks, f"{split}-{i}")
        yield traces.inject(clean, kind, np.random.default_rng([seed, 1]), after=FAULT_AFTER[kind.trace])


class Progress:
    """A line per trace family on stderr."""

    def __init__(self, label: str) -> None:
        self.label, self.start, self.steps = label, time.perf_counter(), 0

    def note(self, what: str, rows: int) -> None:
        self.steps += rows
        elapsed = time.perf_counter() - self.start
        print(
            f"[{self.label}] {elapsed:6.1f} s  {self.steps / 1e6:6.2f} M steps  {what}",
            file=sys.stderr,
            flush=True,
        )


def evaluate(
    split: str, plan: Plan, variants: dict[str, Variant], faults: list[traces.FaultKind], chunk: int
) -> dict[str, Tally]:
    """Every variant over the split's clean and faulted traces (each trace generated and fed once)."""
    tallies = {name: Tally() for name in variants}
    progress = Progress(split)
    for trace in clean_traces(split, plan):
        batches = list(feed.batches(trace, chunk))
        for name, variant in variants.items():
            tally = tallies[name]
            tally.clean_rows[trace.kind] += trace.rows
            for o in run(trace, batches, variant()):
                tally.clean_episodes[o.detector][trace.kind] += 1
        progress.note(f"clean {trace.run_id}", trace.rows)
    for kind in faults:
        rows = 0
        for trace in fault_traces(split, plan, kind):
            batches = list(feed.batches(trace, chunk))
            for name, variant in variants.items():
                judge(trace, kind, run(trace, batches, variant()), tallies[name])
            rows += trace.rows
        progress.note(f"{kind.kind} {kind.size} x{plan.per_fault}", rows)
    return tallies


# ----------------------------------------------------------------------------------------------- report


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:.0f}%" if d else "-"


def _q(values: Sequence[float], q: float, fmt: str = "{:.0f}") -> str:
    return fmt.format(float(np.percentile(values, q))) if values else "-"


def _rate(episodes: int, rows: int) -> float:
    return 1e5 * episodes / rows if rows else 0.0


def fault_table(tally: Tally) -> tuple[str, list[str]]:
    """The per-fault table and the names of the rows that miss their target."""
    rows, failed = [], []
    for (kind, size), r in tally.rows.items():
        detected = len(r.latencies)
        verdict = "-"
        if r.budgeted:
            ok = r.in_budget == r.budgeted
            verdict = "PASS" if ok else "FAIL"
            if not ok:
                failed.append(f"{r.detector} on {kind} {size}")
        budget = "-"
        if r.budgeted:
            budget = "2 win" if kind in ("slowdown", "straggler") else "0" if kind == "non_finite" else "1"
        rows.append(
            [
                r.detector,
                kind,
                size,
                r.faults,
                _pct(detected, r.faults),
                _q(r.latencies, 50),
                _q(r.latencies, 95),
                _q(r.seconds, 50, "{:.0f}") if kind == "stall" else "-",
                budget,
                _pct(r.in_budget, r.budgeted),
                _pct(r.matched, r.episodes),
                r.episodes,
                verdict,
            ]
        )
    headers = ["detector", "fault", "size", "n", "recall", "lat p50", "lat p95", "lat s p50", "budget", "in budget"]
    return table([*headers, "precision", "episodes", "target"], rows), failed


def clean_table(tally: Tally, names: list[str]) -> tuple[str, list[str]]:
    rows, failed = [], []
    sup, rl = tally.clean_rows["supervised"], tally.clean_rows["rl"]
    for name in names:
        eps = tally.clean_episodes[name]
        rates = [_rate(eps["supervised"], sup), _rate(eps["rl"], rl)]
        ok = max(rates) <= TARGET_FP_PER_100K
        if not ok:
            failed.append(f"{name} false positives")
        rows.append(
            [name, eps["supervised"], f"{rates[0]:.2f}", eps["rl"], f"{rates[1]:.2f}", "PASS" if ok else "FAIL"]
        )
    headers = ["detector", f"episodes / {sup:,} sup. steps", "per 100k", f"episodes / {rl:,} RL steps", "per 100k"]
    return table([*headers, "target ≤ 1"], rows), failed


def faulted_table(tally: Tally, names: list[str]) -> str:
    rows = []
    for name in names:
        c = tally.faulted[name]
        false = c["episodes"] - c["matched"]
        after = sorted(((n, k[6:]) for k, n in c.items() if k.startswith("after ")), reverse=True)
        top = ", ".join(f"{kind} {n}" for n, kind in after[:4]) or "-"
        rows.append([name, c["episodes"], c["matched"], false, c["before"], _pct(c["matched"], c["episodes"]), top])
    headers = ["detector", "episodes", "match a fault", "false", "before the fault", "precision"]
    return table([*headers, "false after the fault, by fault"], rows)


# ----------------------------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Sweep:
    detector: str
    key: str
    values: list[str]


def parse_sweep(text: str) -> Sweep:
    try:
        path, values = text.split("=", 1)
        detector, key = path.split(".", 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sweep {text!r}: write DETECTOR.KEY=V1,V2,...") from None
    return Sweep(detector, key, values.split(","))


def _settings(config: DaemonConfig, detector: str) -> msgspec.Struct:
    return getattr(config.detectors, detector)  # type: ignore[no-any-return]


def _with(config: DaemonConfig, detector: str, key: str, value: str) -> DaemonConfig:
    """``config`` with ``detectors.<detector>.<key>`` set to ``value`` (converted to the key's type)."""
    current = msgspec.structs.asdict(_settings(config, detector))
    if key not in current:
        raise SystemExit(f"--sweep: {detector} has no setting {key!r} (it has {', '.join(current)})")
    settings = msgspec.convert({**current, key: value}, type(_settings(config, detector)), strict=False)
    return msgspec.structs.replace(config, detectors=msgspec.structs.replace(config.detectors, **{detector: settings}))


def _alone(cls: type[Any], settings: msgspec.Struct) -> detectors.Detectors:
    return detectors.Detectors([cls(settings)])


def calibrate(config: DaemonConfig, sweeps: list[Sweep], plan: Plan, chunk: int) -> DaemonConfig:
    """Pick each swept value on the calibration seeds; ``config`` with the picks."""
    classes = {d.name: d for d in detectors.REGISTRY}
    for sweep in sweeps:
        if sweep.detector not in classes:
            raise SystemExit(f"--sweep: no detector {sweep.detector!r} is registered ({', '.join(classes)})")
        cls = classes[sweep.detector]
        variants: dict[str, Variant] = {}
        for value in sweep.values:
            settings = _settings(_with(config, sweep.detector, sweep.key, value), sweep.detector)
            variants[value] = functools.partial(_alone, cls, settings)
        faults = [k for k in traces.FAULTS if k.detector == sweep.detector]
        tallies = evaluate("calib", plan, variants, faults, chunk)
        scored = []
        for value, tally in tallies.items():
            eps = tally.clean_episodes[sweep.detector]
            fp = max(_rate(eps["supervised"], tally.clean_rows["supervised"]), _rate(eps["rl"], tally.clean_rows["rl"]))
            recalls = [len(r.latencies) / r.faults for r in tally.rows.values() if r.faults]
            scored.append((value, float(np.mean(recalls)) if recalls else 0.0, fp))
        ok = [s for s in scored if s[2] <= TARGET_FP_PER_100K]
        best = max(ok, key=lambda s: (s[1], -s[2])) if ok else min(scored, key=lambda s: s[2])
        print(f"\n## Calibration of {sweep.detector}.{sweep.key} (calib seeds)\n")
        rows = [[v, f"{100 * r:.1f}%", f"{fp:.2f}", "<- chosen" if v == best[0] else ""] for v, r, fp in scored]
        print(table([sweep.key, "mean recall", "FP per 100k", ""], rows))
        config = _with(config, sweep.detector, sweep.key, best[0])
    return config


# ----------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small run (< 60 s)")
    parser.add_argument("--config", help="daemon TOML file whose [detectors.*] tables to use")
    parser.add_argument("--split", choices=("heldout", "calib"), default="heldout", help="seeds to report on")
    parser.add_argument("--sweep", type=parse_sweep, action="append", default=[], help="DETECTOR.KEY=V1,V2,...")
    parser.add_argument("--chunk", type=int, default=256, help="steps per rank per batch (default 256)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--details", action="store_true", help="list every fault missed or detected late")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    config = load(args.config)
    started = time.perf_counter()
    if args.sweep:
        config = calibrate(config, args.sweep, plan, args.chunk)
    names = [d.name for d in detectors.REGISTRY]
    faults = [k for k in traces.FAULTS if k.detector in names]
    missing = sorted({k.detector for k in traces.FAULTS} - set(names))
    tally = evaluate(args.split, plan, {"report": lambda: detectors.build(config.detectors)}, faults, args.chunk)[
        "report"
    ]

    print(
        f"\n# Detector evaluation: {args.split} seeds, {'quick' if args.quick else 'full'} plan, chunk {args.chunk}\n"
    )
    print(f"registered: {', '.join(names)}" + (f"; not registered (no rows): {', '.join(missing)}" if missing else ""))
    print(f"config: {args.config or 'defaults'}; {plan.per_fault} traces per fault and size\n")
    faults_text, failed = fault_table(tally)
    print(faults_text)
    print("\n## False positives on clean traces\n")
    clean_text, clean_failed = clean_table(tally, names)
    print(clean_text)
    print("\n## Episodes on faulted traces, per detector\n")
    print(faulted_table(tally, names))
    failed += clean_failed
    if args.details:
        print("\n## Faults missed or detected late\n")
        for (kind, size), row in tally.rows.items():
            for line in row.misses:
                print(f"- {kind} {size}: {line}")
    print(f"\ntargets: {'all PASS' if not failed else 'FAIL: ' + '; '.join(failed)}")
    print(f"elapsed {time.perf_counter() - started:.1f} s")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
