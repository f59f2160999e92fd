"""How alert updates read: as rows (table, CSV, JSON lines via ``formatting.render``) and as one line of text."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from trainvigil.daemon.formatting import render
from trainvigil.schemas import Anomaly
from trainvigil.schemas.query import QueryResult

REPLAY_FIELDS: tuple[str, ...] = (
    "run_id",
    "rank",
    "step",
    "detector",
    "severity",
    "state",
    "value",
    "baseline",
    "threshold",
    "message",
)
"""What ``vigil replay`` prints per update."""

ALL_FIELDS: tuple[str, ...] = ("time", *REPLAY_FIELDS, "episode", "last_step")
"""Every field of an update (``time``: Unix seconds)."""


def as_result(anomalies: list[Anomaly], fields: tuple[str, ...] = ALL_FIELDS) -> QueryResult:
    """``anomalies`` as rows, so every output format of ``vigil sql`` applies to them."""
    return QueryResult(columns=list(fields), rows=[[getattr(a, f) for f in fields] for a in anomalies])


def as_json(anomaly: Anomaly, fields: tuple[str, ...] = ALL_FIELDS) -> dict[str, object]:
    """One update as a JSON-safe dict (a NaN value becomes the string ``"NaN"``, as in ``vigil sql``)."""
    result: dict[str, object] = json.loads(render(as_result([anomaly], fields), "json"))
    return result


def summary(anomaly: Anomaly) -> str:
    """One line a person reads first: what, where, how bad, and the detector's advice."""
    a = anomaly
    when = datetime.fromtimestamp(a.time, UTC).strftime("%Y-%m-%d %H:%M:%S")
    where = f"run {a.run_id} rank {a.rank}" + (f" step {a.step}" if a.step is not None else "")
    return f"{when} [{a.severity.upper()}] {a.detector} {a.state} on {where}: {a.message}"
