"""``vigil report`` over a history holding canaries and real runs: its numbers equal the tables' rows counted here."""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import pytest
from support import NatsServer, vigil, vigil_together

from trainvigil.daemon.cli.report import CATEGORIES
from trainvigil.daemon.store.writer import Store
from trainvigil.schemas import Anomaly, CanaryResult

NOW = time.time()
HOUR, DAY = 3600.0, 86400.0

CanaryVerdict = Literal["", "pass", "fail", "error", "aborted"]  # CanaryResult.verdict
# (name, fault, verdict, expected, fired, latency_steps, latency_s, age in hours)
CANARIES: list[tuple[str, str, CanaryVerdict, str, str, int | None, float | None, int]] = [
    ("canary-a", "nan_grad", "pass", "non_finite", "non_finite", 0, 0.05, 1),
    ("canary-b", "nan_grad", "fail", "non_finite", "non_finite", 4, 0.4, 2),  # late
    ("canary-c", "nan_grad", "pass", "non_finite", "non_finite", 0, 0.02, 3),
    ("canary-d", "grad_spike", "fail", "grad_spike", "loss_spike", 2, 0.3, 4),  # missed: another one fired
    ("canary-e", "slowdown", "error", "slowdown", "", None, None, 5),
    ("canary-f", "slowdown", "pass", "slowdown", "slowdown", 40, 35.5, 6),
    ("canary-g", "none", "pass", "", "", None, None, 7),
    ("canary-h", "none", "fail", "", "slowdown", None, None, 8),  # a clean twin that warned
    ("canary-i", "kl_explode", "aborted", "kl_explode", "", None, None, 9),
    ("canary-old", "nan_grad", "fail", "non_finite", "", None, None, 30),  # before the window
]
# (run_id, status, last seen hours ago)
RUNS = [
    ("real-ok", "ok", 1),
    ("real-paged", "ok", 2),
    ("real-warned", "running", 3),
    ("real-error", "error", 4),
    ("real-old", "ok", 50),  # outside the window
    ("canary-a", "ok", 1),
    ("canary-h", "ok", 8),
]
# (run_id, detector, severity, hours ago)
ALERTS = [
    ("real-paged", "grad_spike", "page", 2),
    ("real-paged", "loss_spike", "warn", 2),
    ("real-warned", "slowdown", "warn", 3),
    ("real-error", "run_failed", "page", 4),
    ("real-error", "loss_spike", "page", 4.5),
    ("real-old", "non_finite", "page", 50),  # outside the window
    ("real-ok", "gil_contention", "page", 30),  # an old page: the run is still degraded, the episode not counted
    ("canary-b", "non_finite", "page", 2),  # a canary's own episodes are not real runs'
    ("canary-b", "canary_failed", "page", 2),
    ("_daemon", "disk_full", "page", 5),
]


def _history(path: Path) -> None:
    store = Store(path)
    try:
        for name, fault, verdict, expected, fired, steps, seconds, age in CANARIES:
            result = CanaryResult(
                time=NOW - age * HOUR, name=name, fault=fault, passed=verdict == "pass", expected_detector=expected,
                workload="supervised", verdict=verdict, fired_detector=fired, latency_steps=steps, latency_s=seconds,
                fault_step=None if fault == "none" else 100, exit_code=0, duration_s=30.0,
            )  # fmt: skip
            store.record_canary(result, [])
        for run_id, status, age in RUNS:
            store.con.execute(
                "INSERT INTO runs VALUES (?, to_timestamp(?), to_timestamp(?), 1, ?, NULL, NULL)",
                [run_id, NOW - age * HOUR - 60, NOW - age * HOUR, status],
            )
        store.write_anomalies(
            [
                Anomaly(time=NOW - age * HOUR, run_id=run, rank=0, step=1, detector=d, severity=s, episode=f"{run}{i}")  # type: ignore[arg-type]
                for i, (run, d, s, age) in enumerate(ALERTS)
            ]
        )
    finally:
        store.close()


def _report(data: Path, fmt: str, nats_url: str) -> list[str]:
    """``vigil report`` of ``data``'s file, through a broker no daemon listens on (its no-responders answer comes
    at once, where a closed port costs the client seconds of retries)."""
    return ["report", "--since", "24h", "--format", fmt, "--data-dir", str(data), "--nats", nats_url]


def _rows(path: Path, sql: str) -> list[dict[str, Any]]:
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        cursor = con.execute(sql)
        names = [c[0] for c in cursor.description or []]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _expected(path: Path) -> dict[str, Any]:
    """The report's numbers, counted in Python from plain SELECTs of the same tables."""
    cutoff = NOW - DAY
    canaries = [
        r for r in _rows(path, "SELECT * EXCLUDE (time), epoch(time) AS t FROM canary_results") if r["t"] >= cutoff
    ]
    verdicts = Counter(r["verdict"] for r in canaries)
    judged = len(canaries) - verdicts["aborted"]
    faults = []
    for fault in sorted({r["fault"] for r in canaries}):
        mine = [r for r in canaries if r["fault"] == fault]
        n = Counter(r["verdict"] for r in mine)
        caught = [r for r in mine if r["fired_detector"] and r["fired_detector"] == r["expected_detector"]]
        steps, seconds = [r["latency_steps"] for r in caught], [r["latency_s"] for r in caught]
        faults.append(
            {
                "fault": fault, "runs": len(mine) - n["aborted"], "passed": n["pass"], "failed": n["fail"],
                "errored": n["error"],
                "recall": round(n["pass"] / (n["pass"] + n["fail"]), 4) if n["pass"] + n["fail"] else None,
                "latency_steps_median": statistics.median(steps) if steps else None,
                "latency_steps_worst": max(steps) if steps else None,
                "latency_s_median": statistics.median(seconds) if seconds else None,
                "latency_s_worst": max(seconds) if seconds else None,
            }
        )  # fmt: skip
    runs = _rows(path, "SELECT run_id, status, epoch(last_seen) AS seen FROM runs")
    alerts = _rows(path, "SELECT run_id, detector, severity, epoch(time) AS t FROM anomalies")
    real = {r["run_id"] for r in runs if not r["run_id"].startswith("canary-")}
    recent = [a for a in alerts if a["t"] >= cutoff]
    by_detector = Counter((a["detector"], a["severity"]) for a in recent if a["run_id"] in real)
    paged = {a["run_id"] for a in alerts if a["severity"] == "page"}
    live = [r for r in runs if r["run_id"] in real and r["seen"] >= cutoff]
    errors = [r for r in live if r["status"] == "error"]
    categories = Counter(
        "daemon" if a["run_id"] == "_daemon" else CATEGORIES.get(a["detector"], "other")
        for a in recent
        if not a["run_id"].startswith("canary-") or a["detector"] == "canary_failed"
    )
    return {
        "canaries": {
            "run": len(canaries), "aborted": verdicts["aborted"], "passed": verdicts["pass"],
            "failed": verdicts["fail"], "errored": verdicts["error"],
            "health_rate": round(verdicts["pass"] / judged, 4),
        },
        "faults": faults,
        "detectors": [
            {"detector": d, "warn": by_detector[d, "warn"], "page": by_detector[d, "page"],
             "episodes": by_detector[d, "warn"] + by_detector[d, "page"]}
            for d in sorted({d for d, _ in by_detector})
        ],
        "runs": {
            "total": len(live),
            "healthy": sum(r not in errors and r["run_id"] not in paged for r in live),
            "degraded": sum(r not in errors and r["run_id"] in paged for r in live),
            "ended_with_error": len(errors),
        },
        "categories": [
            {"category": c, "episodes": n} for c, n in sorted(categories.items(), key=lambda i: (-i[1], i[0]))
        ],
    }  # fmt: skip


def test_vigil_report_equals_what_the_tables_hold(tmp_path: Path, nats_server: NatsServer) -> None:
    data = tmp_path / "data"
    _history(data / "vigil.duckdb")
    done = vigil(*_report(data, "json", nats_server.url))
    assert done.returncode == 0, done.stderr
    assert "no daemon answered" in done.stderr
    report = json.loads(done.stdout)
    expected = _expected(data / "vigil.duckdb")
    for section, value in expected.items():
        assert report[section] == pytest.approx(value) if isinstance(value, dict) else report[section] == value, section
    # Spelled out, so a wrong count in both the report and the check above still shows.
    assert report["canaries"] == {
        "run": 9, "aborted": 1, "passed": 4, "failed": 3, "errored": 1, "health_rate": 0.5
    }  # fmt: skip
    assert report["runs"] == {"total": 4, "healthy": 1, "degraded": 2, "ended_with_error": 1}
    nan = next(f for f in report["faults"] if f["fault"] == "nan_grad")
    assert (nan["recall"], nan["latency_steps_median"], nan["latency_steps_worst"]) == (0.6667, 0, 4)


def test_vigil_report_prints_every_section_as_a_table_and_refuses_a_bad_window(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    data = tmp_path / "data"
    _history(data / "vigil.duckdb")
    done, bad = vigil_together(
        _report(data, "table", nats_server.url), ["report", "--since", "yesterday", "--data-dir", str(data)]
    )
    assert done.returncode == 0, done.stderr
    for title in ("Canaries", "Detection per fault kind", "Real runs", "per detector", "Alert categories"):
        assert title in done.stdout
    assert bad.returncode == 2 and "--since 'yesterday'" in bad.stderr
