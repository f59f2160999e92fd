"""Today's detectors on the corpus of real runs (``tests/data/corpus/``): recall, latency, false alarms.

Every recorded run goes through a fresh set of detectors (``detectors.build`` of the
configured settings) exactly as ``vigil replay`` feeds them (``replay.batches``: a run at a
time, 256-step batches, ticks through silences), with the run's recorded events,
heartbeats and ``run_end`` records riding along at their times (``records=``), so a rank
that ended or a quiet rank whose heartbeats go on looks as it did live. ``--live`` scores
the alerts the daemon raised while the run was being recorded instead. Scoring rules:
``corpus.score``. Prints:

* per fault run: the expected detectors, the first that caught the fault after it (step,
  latency in steps and seconds, within the manifest's budget or not), whether the episode
  cleared on a run that stays broken, false alarms before the fault, other episodes after;
* per detector: faults it is expected to catch, caught within budget (recall), latencies,
  false pages and warns per 10 000 clean steps (step rows of clean runs and of fault runs
  before their fault, all ranks), and the clean steps covered.

    python bench/corpus_eval.py                      # replay, default detector settings
    python bench/corpus_eval.py --json > before.json # for diffing against a later change
    python bench/corpus_eval.py --live               # the live daemon's alerts at recording time
    python bench/corpus_eval.py --config vigil.toml --only gpt-hang
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corpus import load
from corpus.runs import PLANNED
from corpus.score import RunScore, Update, score
from tables import table

from trainvigil.daemon import detectors
from trainvigil.daemon.cli.replay import replay_table
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.config import load as load_config

PER = 10_000
"""False alarms are reported per this many clean steps."""


def alerts(run: load.Run, config: DaemonConfig, *, live: bool = False) -> Sequence[Update]:
    """The run's alert updates: replayed through today's detectors, or as the live daemon stored them."""
    if live:
        return run.live_alerts()
    return replay_table(run.steps, config, records=run.records())


def evaluate(runs: Sequence[load.Run], config: DaemonConfig, *, live: bool = False) -> list[RunScore]:
    """One score per run, in the order given."""
    return [score(run, alerts(run, config, live=live)) for run in runs]


def detector_rows(scores: Sequence[RunScore], runs: Sequence[load.Run]) -> list[dict[str, Any]]:
    """Per detector (registered, then planned): recall, latencies, false alarms per 10k clean steps."""
    clean = sum(s.clean_steps for s in scores)
    budgets = {r.name: (r.budget_steps, r.budget_s) for r in runs}
    registered = [d.name for d in detectors.REGISTRY]
    names = registered + [n for n in PLANNED if n not in registered]
    rows = []
    for name in names:
        mine = [s for s in scores if name in s.expected]
        caught = [s for s in mine if name in s.first and s.first[name].in_budget]
        latencies = []
        for s in mine:
            c = s.first.get(name)
            steps, seconds = budgets[s.name]
            budget = "/".join(
                x for x in (f"{steps}st" if steps is not None else "", f"{seconds:g}s" if seconds else "") if x
            )
            got = "missed" if c is None else f"{c.steps}st {c.seconds:.0f}s"
            latencies.append(f"{s.name}: {got} (budget {budget})")
        pages = sum(1 for s in scores for e in s.false_pages if e.detector == name)
        warns = sum(1 for s in scores for e in s.false_warns if e.detector == name)
        rows.append(
            {
                "detector": name,
                "registered": name in registered,
                "faults": len(mine),
                "caught_in_budget": len(caught),
                "caught_at_all": sum(1 for s in mine if name in s.first),
                "recall": len(caught) / len(mine) if mine else None,
                "latencies": latencies,
                "false_pages": pages,
                "false_warns": warns,
                "false_pages_per_10k": PER * pages / clean if clean else None,
                "false_warns_per_10k": PER * warns / clean if clean else None,
                "clean_steps": clean,
            }
        )
    return rows


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def report(scores: Sequence[RunScore], rows: Sequence[dict[str, Any]], source: str) -> str:
    runs_table = []
    for s in scores:
        j = s.as_json()
        runs_table.append(
            [
                s.name,
                s.fault,
                _fmt(s.fault_step, "d"),
                "|".join(s.expected) or "-",
                "-"
                if j["detected_by"] is None
                else f"{j['detected_by']}@{j['detected_step']} {j['detected_severity']}",
                _fmt(j["latency_steps"], "d"),
                _fmt(j["latency_s"], ".0f"),
                "-" if s.fault == "none" else ("yes" if j["in_budget"] else "no"),
                "-" if j["cleared"] is None else ("yes" if j["cleared"] else "no"),
                len(s.false_pages),
                len(s.false_warns),
                " ".join(j["collateral"][:4]) + (" ..." if len(j["collateral"]) > 4 else ""),
            ]
        )
    det_table = [
        [
            r["detector"] + ("" if r["registered"] else " (planned)"),
            r["faults"],
            f"{r['caught_in_budget']}/{r['faults']}" if r["faults"] else "-",
            _fmt(r["recall"]),
            r["false_pages"],
            _fmt(r["false_pages_per_10k"]),
            r["false_warns"],
            _fmt(r["false_warns_per_10k"]),
        ]
        for r in rows
    ]
    latency_lines = [f"  {r['detector']}: " + "; ".join(r["latencies"]) for r in rows if r["latencies"]]
    clean = rows[0]["clean_steps"] if rows else 0
    return "\n\n".join(
        [
            f"Corpus evaluation ({source}): {len(scores)} runs, {clean} clean steps (clean runs + fault runs before "
            "their fault, all ranks)",
            table(
                [
                    "run",
                    "fault",
                    "at",
                    "expected",
                    "caught by",
                    "lat st",
                    "lat s",
                    "in budget",
                    "cleared",
                    "false pg",
                    "false wn",
                    "after the fault (! = page)",
                ],
                runs_table,
            ),
            table(
                ["detector", "faults", "in budget", "recall", "false pages", "per 10k", "false warns", "per 10k"],
                det_table,
            ),
            "Latency per fault (steps, seconds after the fault):\n" + "\n".join(latency_lines),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=load.CORPUS)
    p.add_argument("--config", type=Path, default=None, help="daemon TOML (its [detectors] tables)")
    p.add_argument("--only", action="append", metavar="RUN", help="this run only (repeatable)")
    p.add_argument("--live", action="store_true", help="score the alerts the live daemon raised at recording time")
    p.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    args = p.parse_args(argv)
    runs = load.runs(args.corpus)
    if args.only:
        runs = [r for r in runs if r.name in args.only]
    if not runs:
        print(
            f"corpus_eval: no runs in {args.corpus}; record them: python -m bench.corpus.record --all", file=sys.stderr
        )
        return 2
    config = load_config(args.config) if args.config else DaemonConfig()
    scores = evaluate(runs, config, live=args.live)
    rows = detector_rows(scores, runs)
    source = "live alerts at recording time" if args.live else "replay through today's detectors"
    if args.json:
        print(json.dumps({"source": source, "runs": [s.as_json() for s in scores], "detectors": rows}, indent=1))
    else:
        print(report(scores, rows, source))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
