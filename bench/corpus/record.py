"""Record the corpus: each run trains for real with the agent, beside a real broker and daemon.

    python -m bench.corpus.record --all              # every run in runs.SPECS (about an hour on 2 cores)
    python -m bench.corpus.record --essential        # the runs the detector work needs first
    python -m bench.corpus.record --only gpt-hang --only sup-digits-clean
    python -m bench.corpus.record --all --outdated --workload ppo   # what runs.py changed since
    python -m bench.corpus.record --list

Per run: a fresh nats-server and ``vigil up`` in a temporary directory, the workload as
``nice -n 10 python -m bench.corpus.<workload>`` (one process per rank, ``VIGIL_RUN_ID`` =
the run's name), then the stored rows are exported (``_export``) to
``tests/data/corpus/<name>/`` with a ``manifest.json`` (``manifest``). A progress line
every 20 s says how far the run got. Needs the ``corpus`` and ``daemon`` extras.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import _export, manifest
from ._stack import Stack
from .runs import BY_NAME, SPECS, RunSpec

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "corpus"
PROGRESS_S = 20.0


def _train(spec: RunSpec, stack: Stack, workdir: Path) -> list[int]:
    """Run the workload's processes to their end; returns their exit codes."""
    procs = []
    for rank in range(spec.ranks):
        env = {
            **os.environ,
            "VIGIL_NATS_URL": stack.url,
            "VIGIL_RUN_ID": spec.name,
            "RANK": str(rank),
            "WORLD_SIZE": str(spec.ranks),
            "LOCAL_RANK": str(rank),
            "OMP_NUM_THREADS": "1",
            "VIGIL_SPILL_DIR": str(workdir / "spill"),
        }
        argv = ["nice", "-n", "10", sys.executable, "-m", f"bench.corpus.{spec.workload}", *spec.argv()]
        argv += ["--fault-log", str(workdir / f"fault-r{rank}.jsonl")]
        with (workdir / f"train-r{rank}.log").open("wb") as log:
            procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    next_report = time.monotonic() + PROGRESS_S
    while any(p.poll() is None for p in procs):
        time.sleep(0.5)
        if time.monotonic() >= next_report:
            next_report += PROGRESS_S
            print(f"  {spec.name}: {_last_line(workdir / 'train-r0.log')}", flush=True)
    return [p.returncode for p in procs]


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][-120:] if lines else "starting"


def record(spec: RunSpec, corpus: Path = CORPUS) -> float:
    """Train, store and export one run; returns the seconds it took."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"corpus-{spec.name}-") as tmp:
        workdir = Path(tmp)
        with Stack(workdir) as stack:
            codes = _train(spec, stack, workdir)
            if not stack.wait_stored(spec.name, spec.ranks):
                print(f"  {spec.name}: warning: not every rank's run_end was stored", flush=True)
        expect_fail = spec.fault in ("crash", "nan") and spec.workload == "ppo"
        if any(codes) and not expect_fail:
            tail = (workdir / "train-r0.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{spec.name}: training exited with {codes}:\n{tail}")
        out = corpus / spec.name
        rows = _export.export(stack.db, spec.name, out)
        seconds = time.monotonic() - started
        manifest.write(out, spec, workdir, codes=codes, rows=rows, seconds=seconds)
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every run")
    which.add_argument("--essential", action="store_true", help="the runs the detector work needs first")
    which.add_argument("--only", action="append", metavar="NAME", help="this run (repeatable)")
    which.add_argument("--list", action="store_true", help="list the runs and exit")
    p.add_argument("--outdated", action="store_true", help="only runs not recorded yet, or recorded with other flags")
    p.add_argument("--workload", choices=("ppo", "supervised", "gpt", "regression"), help="only this workload's runs")
    p.add_argument("--corpus", type=Path, default=CORPUS)
    args = p.parse_args(argv)
    if args.list:
        for spec in SPECS:
            print(f"{spec.name:32} {spec.workload:10} {spec.fault:16} {'essential' if spec.essential else ''}")
        return 0
    if args.only:
        unknown = [n for n in args.only if n not in BY_NAME]
        if unknown:
            p.error(f"unknown run(s) {', '.join(unknown)}; --list shows them")
        chosen = [BY_NAME[n] for n in args.only]
    else:
        chosen = [s for s in SPECS if args.all or s.essential]
    if args.workload:
        chosen = [s for s in chosen if s.workload == args.workload]
    if args.outdated:
        chosen = [s for s in chosen if not manifest.current(args.corpus / s.name, s)]
    for i, spec in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {spec.name}: {spec.workload} {' '.join(spec.argv())}", flush=True)
        seconds = record(spec, args.corpus)
        print(f"[{i}/{len(chosen)}] {spec.name}: recorded in {seconds:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
