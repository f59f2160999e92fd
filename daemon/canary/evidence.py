"""The store edge of the canary runner: what a canary's run left in DuckDB, read on a cursor of its own.

Every function takes a read connection (``Store.cursor()``) and a run id and runs on a worker
thread; nothing here writes (verdicts go through ``Store.record_canary``).
"""

from __future__ import annotations

import duckdb

from trainvigil.daemon.canary.verdict import Alert, Evidence, Injection

CANARY_ALERT = "canary_failed"
"""The detector name of the alert a failed canary raises (on its own run: never evidence)."""


def alerts(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[Alert, ...]:
    """Every alert episode of ``run_id`` but the canary's own verdict alert."""
    rows = con.execute(
        "SELECT detector, severity, step, epoch(time), rank FROM anomalies "
        "WHERE run_id = ? AND detector <> ? ORDER BY time",
        [run_id, CANARY_ALERT],
    ).fetchall()
    return tuple(Alert(d, s, None if step is None else int(step), float(t), int(r or 0)) for d, s, step, t, r in rows)


def gather(con: duckdb.DuckDBPyConnection, run_id: str, fault: str) -> Evidence:
    """The alerts, the injection of ``fault`` (or why it never went in) and whether every rank ended."""
    events = con.execute(
        "SELECT kind, coalesce(step, TRY_CAST(json_extract_string(fields, '$.planned_step') AS BIGINT)), "
        "epoch(time), json_extract_string(fields, '$.why') FROM events "
        "WHERE run_id = ? AND kind IN ('fault_injected', 'fault_missed') "
        "AND json_extract_string(fields, '$.kind') = ? ORDER BY time",
        [run_id, fault],
    ).fetchall()
    injected = next((Injection(int(s), float(t)) for k, s, t, _ in events if k == "fault_injected"), None)
    missed = next((why or "no reason given" for k, _, _, why in events if k == "fault_missed"), "")
    return Evidence(alerts(con, run_id), injected, missed, ended(con, run_id))


def ended(con: duckdb.DuckDBPyConnection, run_id: str) -> bool:
    """Whether a ``run_end`` of every rank of ``run_id`` is stored (the job's data is all in)."""
    row = con.execute(
        "SELECT (SELECT count(DISTINCT rank) FROM events WHERE run_id = ? AND kind = 'run_end'), "
        "(SELECT world_size FROM runs WHERE run_id = ?)",
        [run_id, run_id],
    ).fetchone()
    assert row is not None
    ends, world = row
    return world is not None and ends >= world


def fired(con: duckdb.DuckDBPyConnection, run_id: str, detector: str) -> bool:
    """Whether ``detector`` raised anything on ``run_id`` yet (a job that cannot end is stopped then)."""
    row = con.execute("SELECT count(*) FROM anomalies WHERE run_id = ? AND detector = ?", [run_id, detector]).fetchone()
    return row is not None and row[0] > 0


def known_run(con: duckdb.DuckDBPyConnection, run_id: str) -> bool:
    """Whether ``run_id`` already has data or a verdict (a canary's run id is never reused)."""
    row = con.execute(
        "SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = ?) OR EXISTS (SELECT 1 FROM canary_results WHERE name = ?)",
        [run_id, run_id],
    ).fetchone()
    return row is not None and bool(row[0])


def latest_verdicts(con: duckdb.DuckDBPyConnection) -> list[tuple[str, float, bool]]:
    """Per fault kind, when its latest judged canary (not aborted) was judged and whether it passed."""
    rows = con.execute(
        "SELECT fault, max(epoch(time)), arg_max(verdict, time) = 'pass' FROM canary_results "
        "WHERE verdict IS DISTINCT FROM 'aborted' GROUP BY fault ORDER BY fault"
    ).fetchall()
    return [(str(f), float(t), bool(ok)) for f, t, ok in rows]
