"""``manifest.json``: what a recorded run is, what was done to it, and what should catch it.

Written by the recorder from the run's spec, the workload's fault log (the fault's step and
Unix time, measured in the training process at the moment it started) and the exported
rows; read by :mod:`.load`. Keys:

- ``name``, ``workload``, ``command`` (the workload's flags), ``seed``, ``ranks``
- ``fault``: ``null`` for a clean run, else ``kind``, ``step``, ``time``, ``rank`` (``null``: all ranks)
- ``expected`` (detectors, any of them counts), ``budget`` (``steps``/``seconds``, either
  suffices; ``null`` = no budget of that kind), ``persistent``, ``note``
- ``steps`` (rows per rank), ``last_step`` (per rank), ``rows`` (per table), ``status``
  (the ``runs`` table's), ``exit_codes``, ``completed`` (the loop reached its end)
- ``record_seconds``, ``recorded``: date, Python, torch and trainvigil commit
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from .runs import RunSpec

FILE = "manifest.json"


def _fault_log(workdir: Path, ranks: int) -> tuple[dict[str, Any] | None, bool]:
    """The earliest fault record over the ranks' logs, and whether every rank completed."""
    faults, done = [], 0
    for rank in range(ranks):
        path = workdir / f"fault-r{rank}.jsonl"
        for line in path.read_text().splitlines() if path.is_file() else []:
            record = json.loads(line)
            if record["record"] == "fault":
                faults.append({**record, "rank": record.get("rank")})
            elif record["record"] == "done":
                done += 1
    first = min(faults, key=lambda f: f["time"]) if faults else None
    return first, done == ranks


def _commit() -> str:
    """HEAD's short hash, ``-dirty`` when the agent, daemon or wire code differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "agents", "daemon", "schemas", "src"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head.stdout.strip() + ("-dirty" if changed.stdout.strip() else "")


def command(spec: RunSpec) -> list[str]:
    """The workload module and its flags, as the manifest records them."""
    return [f"bench.corpus.{spec.workload}", *spec.argv()]


def current(out: Path, spec: RunSpec) -> bool:
    """Whether ``out`` holds a recording of ``spec`` as it is now (same workload and flags)."""
    path = out / FILE
    return path.is_file() and json.loads(path.read_text()).get("command") == command(spec)


def write(out: Path, spec: RunSpec, workdir: Path, *, codes: list[int], rows: dict[str, int], seconds: float) -> None:
    """The manifest of the run exported into ``out``."""
    import torch  # only the recorder needs it: reading the corpus does not

    steps = pq.read_table(out / "steps.parquet", columns=["rank", "step"])
    runs = pq.read_table(out / "runs.parquet").to_pylist()
    per_rank = {}
    for rank in sorted(set(steps["rank"].to_pylist())):
        mine = steps.filter(pc.equal(steps["rank"], rank))["step"]
        per_rank[str(rank)] = {"steps": len(mine), "last_step": pc.max(mine).as_py()}
    fault, completed = _fault_log(workdir, spec.ranks)
    if fault is not None:
        fault = {"kind": fault["kind"], "step": fault["step"], "time": fault["time"], "rank": spec.fault_rank}
    manifest = {
        "name": spec.name,
        "workload": spec.workload,
        "command": command(spec),
        "seed": spec.seed,
        "ranks": spec.ranks,
        "fault": fault,
        "expected": list(spec.expected),
        "budget": {"steps": spec.budget_steps, "seconds": spec.budget_s},
        "persistent": spec.persistent,
        "note": spec.note,
        "steps": {rank: v["steps"] for rank, v in per_rank.items()},
        "last_step": {rank: v["last_step"] for rank, v in per_rank.items()},
        "rows": rows,
        "status": runs[0]["status"] if runs else None,
        "exit_codes": codes,
        "completed": completed,
        "record_seconds": round(seconds, 1),
        "recorded": {
            "date": datetime.date.today().isoformat(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "trainvigil_commit": _commit(),
        },
    }
    (out / FILE).write_text(json.dumps(manifest, indent=2) + "\n")
