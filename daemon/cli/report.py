"""``vigil report``: the health report over a window: canaries, detection per fault kind, real runs, alerts.

Every number is one SQL aggregate over the history (``canary_results``, ``anomalies``, ``runs``),
asked of the running daemon or read from the data directory's file like ``vigil sql``, so the
report says nothing the tables do not. Canaries are the runs whose id starts with ``canary-``;
every other run in ``runs`` is a real run.

- canaries: run, passed, failed, errored, aborted; the health rate is passed / (run - aborted).
- per fault kind (``none``: the clean twins): runs, passed, failed, errored; recall = passed /
  (passed + failed) (a clean twin's: how often it stayed silent); the median and worst latency of
  the expected detector's episodes, passed or late, in steps and seconds.
- per detector: alert episodes opened in the window on real runs, by severity.
- real runs seen in the window: total, healthy, degraded (a page, any time) and ended with error.
- alert categories: episodes opened in the window on real runs and the daemon itself, and the
  ``canary_failed`` alerts, by what kind of trouble their detector watches for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.schemas.credentials import BusAccess
    from trainvigil.schemas.query import QueryResult

CATEGORIES: dict[str, str] = {
    "slowdown": "throughput",
    "straggler": "throughput",
    "non_finite": "non-finite values",
    "grad_spike": "spikes",
    "loss_spike": "spikes",
    "reward_hack": "reward hacking",
    "kl_explode": "KL explosion",
    "gil_contention": "GIL contention",
    "ckpt_mismatch": "checkpoint integrity",
    "stall": "silence and hangs",
    "hang": "silence and hangs",
    "run_failed": "failed runs",
    "generalisation": "generalisation",
    "canary_failed": "canary failures",
}
"""What each detector's alerts are about; the daemon's own pages (disk full, data loss...) are ``daemon``."""
CANARY = "run_id LIKE 'canary-%'"
"""A canary's run (the runner names them ``canary-<id>``)."""

Ask = Callable[[str], "QueryResult"]


def _records(result: QueryResult) -> list[dict[str, Any]]:
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _verdict_counts(where: str) -> str:
    return (
        "count(*) FILTER (WHERE verdict = 'pass') AS passed, count(*) FILTER (WHERE verdict = 'fail') AS failed, "
        f"count(*) FILTER (WHERE verdict = 'error') AS errored FROM canary_results WHERE {where}"
    )


def _category_sql() -> str:
    cases = " ".join(f"WHEN '{d}' THEN '{c}'" for d, c in CATEGORIES.items())
    return f"CASE WHEN run_id = '_daemon' THEN 'daemon' ELSE coalesce(CASE detector {cases} END, 'other') END"


def build(ask: Ask, since_s: float, now: float | None = None) -> dict[str, Any]:
    """The report over the ``since_s`` seconds before ``now`` (default: the present), every section a query."""
    now = time.time() if now is None else now
    start = now - since_s
    window = f"time >= to_timestamp({start!r})"
    canaries = _records(ask(f"SELECT count(*) AS run, count(*) FILTER (WHERE verdict = 'aborted') AS aborted, "
                            f"{_verdict_counts(window)}"))[0]  # fmt: skip
    canaries["health_rate"] = _rate(canaries["passed"], canaries["run"] - canaries["aborted"])
    fired = "fired_detector = expected_detector AND fired_detector <> ''"
    faults = _records(
        ask(
            f"SELECT fault, count(*) FILTER (WHERE verdict <> 'aborted') AS runs, {_verdict_counts(window)} "
            f"GROUP BY fault ORDER BY fault"
        )
    )
    latency = _records(
        ask(
            "SELECT fault, median(latency_steps) AS latency_steps_median, max(latency_steps) AS latency_steps_worst, "
            "median(latency_s) AS latency_s_median, max(latency_s) AS latency_s_worst "
            f"FROM canary_results WHERE {window} AND {fired} GROUP BY fault"
        )
    )
    by_fault = {row.pop("fault"): row for row in latency}
    empty = {
        "latency_steps_median": None,
        "latency_steps_worst": None,
        "latency_s_median": None,
        "latency_s_worst": None,
    }
    for row in faults:
        row["recall"] = _rate(row["passed"], row["passed"] + row["failed"])
        row.update(by_fault.get(row["fault"], empty))
    real = f"run_id IN (SELECT run_id FROM runs WHERE NOT ({CANARY}))"
    detectors = ask(
        "SELECT detector, count(*) FILTER (WHERE severity = 'warn') AS warn, "
        "count(*) FILTER (WHERE severity = 'page') AS page, count(*) AS episodes "
        f"FROM anomalies WHERE {window} AND {real} GROUP BY detector ORDER BY detector"
    )
    paged = "run_id IN (SELECT run_id FROM anomalies WHERE severity = 'page')"
    runs = ask(
        "SELECT count(*) AS total, "
        f"count(*) FILTER (WHERE status IS DISTINCT FROM 'error' AND NOT {paged}) AS healthy, "
        f"count(*) FILTER (WHERE status IS DISTINCT FROM 'error' AND {paged}) AS degraded, "
        "count(*) FILTER (WHERE status = 'error') AS ended_with_error "
        f"FROM runs WHERE last_seen >= to_timestamp({start!r}) AND NOT ({CANARY})"
    )
    categories = ask(
        f"SELECT {_category_sql()} AS category, count(*) AS episodes FROM anomalies "
        f"WHERE {window} AND (NOT ({CANARY}) OR detector = 'canary_failed') GROUP BY 1 ORDER BY 2 DESC, 1"
    )
    return {
        "from": datetime.fromtimestamp(start, UTC).isoformat(timespec="seconds"),
        "to": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
        "canaries": canaries,
        "faults": faults,
        "detectors": _records(detectors),
        "runs": _records(runs)[0],
        "categories": _records(categories),
    }


def _table(title: str, rows: list[dict[str, Any]]) -> str:
    from trainvigil.daemon.formatting import render
    from trainvigil.schemas.query import QueryResult

    if not rows:
        return f"{title}: none\n"
    columns = list(rows[0])
    return f"{title}\n" + render(QueryResult(columns=columns, rows=[[r[c] for c in columns] for r in rows]), "table")


def render(report: dict[str, Any], fmt: str) -> str:
    """The report as tables (``table``) or one JSON object (``json``)."""
    if fmt == "json":
        return json.dumps(report, indent=2) + "\n"
    sections = [
        f"Health report {report['from']} .. {report['to']}\n",
        _table("Canaries", [report["canaries"]]),
        _table("Detection per fault kind (none: clean twins)", report["faults"]),
        _table("Real runs", [report["runs"]]),
        _table("Alert episodes on real runs, per detector", report["detectors"]),
        _table("Alert categories", report["categories"]),
    ]
    return "\n".join(sections)


def run(args: argparse.Namespace, cfg: DaemonConfig, url: str, access: BusAccess) -> int:
    """``vigil report``; the exit status."""
    from trainvigil.daemon.cli.sqlclient import QuerySource
    from trainvigil.daemon.config import parse_interval
    from trainvigil.errors import ConfigError
    from trainvigil.schemas.redact import redact_url

    since = parse_interval(args.since)
    if since is None or since <= 0:
        raise ConfigError(f"--since {args.since!r}: give a window like 30m, 24h or 7d", key="since")
    source = QuerySource(
        nats_url=url, data_dir=cfg.data_dir, timeout=cfg.query_timeout_s + 5, access=access, subjects=cfg.subjects
    )
    with source:
        report = build(lambda sql: source.ask(sql, cfg.query_row_limit), since)
        if not source.from_daemon:
            print(f"vigil: no daemon answered at {redact_url(url)}; read {source.where}", file=sys.stderr)
    sys.stdout.write(render(report, args.format))
    return 0
