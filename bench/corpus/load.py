"""Read the recorded corpus: each run's manifest, its tables, and its run records for replay."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trainvigil.daemon.cli.replay import RunRecord, read_records
from trainvigil.schemas import Source

from ._export import TABLES
from .manifest import FILE

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "data" / "corpus"
"""Where the recorder writes and the evaluation reads (``tests/data/corpus/<run>/``)."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    step: int
    time: float
    rank: int | None
    """The rank the fault is on; None: every rank."""


@dataclass(frozen=True, slots=True)
class LiveAlert:
    """One row of the live daemon's ``anomalies`` table: an episode's latest state."""

    detector: str
    rank: int
    step: int | None
    time: float
    severity: str
    state: str
    episode: str | None
    message: str


@dataclass(frozen=True)
class Run:
    """One recorded run: ``manifest`` as written by the recorder, tables read on first use."""

    path: Path
    manifest: dict[str, Any] = field(repr=False)

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def fault(self) -> Fault | None:
        f = self.manifest["fault"]
        return None if f is None else Fault(f["kind"], int(f["step"]), float(f["time"]), f["rank"])

    @property
    def expected(self) -> tuple[str, ...]:
        return tuple(self.manifest["expected"])

    @property
    def budget_steps(self) -> int | None:
        return self.manifest["budget"]["steps"]  # type: ignore[no-any-return]

    @property
    def budget_s(self) -> float | None:
        return self.manifest["budget"]["seconds"]  # type: ignore[no-any-return]

    def table(self, name: str) -> pa.Table:
        """One of the exported tables (``_export.TABLES``)."""
        if name not in TABLES:
            raise KeyError(f"no table {name!r} in a corpus run; there are {', '.join(TABLES)}")
        return pq.read_table(self.path / f"{name}.parquet")

    @cached_property
    def steps(self) -> pa.Table:
        return self.table("steps")

    def clean_steps(self) -> int:
        """Step rows (all ranks) before the fault: every row of a clean run."""
        fault = self.fault
        if fault is None:
            return self.steps.num_rows
        return int(pc.sum(pc.less(self.steps["step"], fault.step)).as_py() or 0)

    def live_alerts(self) -> list[LiveAlert]:
        """The episodes the daemon raised live while the run trained."""
        names = LiveAlert.__slots__
        return [LiveAlert(**{k: row[k] for k in names}) for row in self.table("alerts_live").to_pylist()]

    def records(self) -> list[tuple[Source, RunRecord]]:
        """The run's recorded run records (starts, events, ends, heartbeats) as the wire carried them."""
        return read_records(self.table("events"), self.table("heartbeats"), int(self.manifest["ranks"]))


def runs(root: Path = CORPUS) -> list[Run]:
    """Every run under ``root`` (a folder with a ``manifest.json``), in name order."""
    return [Run(d, json.loads((d / FILE).read_text())) for d in sorted(root.iterdir()) if (d / FILE).is_file()]
