"""A recorded run, from the daemon's DuckDB file to small zstd Parquet files.

``steps.parquet`` is flat, in the shape ``vigil replay`` reads: ``run_id, rank, step, time``
(Unix seconds) and one float column per metric (the ``extra`` map's keys become columns;
metrics nobody logged are left out). ``events``, ``heartbeats`` and ``runs`` keep the
columns the detectors and the evaluation read, times as Unix seconds; ``alerts_live`` is
the ``anomalies`` table the live daemon wrote while the run trained. Host names, pids and
command lines are left out: they say nothing about the training and differ per machine.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

KNOWN = ("loss", "grad_norm", "lr", "step_time", "samples", "tokens", "reward", "entropy", "kl")
TABLES = ("steps", "events", "heartbeats", "runs", "alerts_live")


def _seconds(column: str) -> str:
    return f"epoch_us({column}) / 1e6 AS {column}"


def _queries(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, str]:
    keys = [row[0] for row in con.execute(
        "SELECT DISTINCT unnest(map_keys(extra)) FROM steps WHERE run_id = ? ORDER BY 1", [run_id]
    ).fetchall()]  # fmt: skip
    counts = con.execute(f"SELECT {', '.join(f'count({c})' for c in KNOWN)} FROM steps WHERE run_id = ?", [run_id])
    logged = [c for c, n in zip(KNOWN, counts.fetchall()[0], strict=True) if n]
    extra = [f"extra['{k}'] AS \"{k}\"" for k in keys]
    where = f"WHERE run_id = '{run_id}'"
    return {
        "steps": f"SELECT run_id, rank, step, {_seconds('time')}, {', '.join([*logged, *extra])} FROM steps {where} "
        "ORDER BY rank, step",
        # run_start's argv names the recorder's temporary paths: only its config is kept.
        "events": f"SELECT run_id, rank, {_seconds('time')}, kind, step, CAST(CASE WHEN kind = 'run_start' "
        "THEN json_object('config', fields->'config') ELSE fields END AS VARCHAR) AS fields "
        f"FROM events {where} ORDER BY time, rank",
        "heartbeats": f"SELECT run_id, rank, {_seconds('time')}, last_step, buffered, connected "
        f"FROM heartbeats {where} ORDER BY time, rank",
        "runs": f"SELECT run_id, world_size, status, {_seconds('first_seen')}, {_seconds('last_seen')}, "
        f"{_seconds('ended_at')} FROM runs {where}",
        "alerts_live": f"SELECT run_id, rank, step, {_seconds('time')}, detector, severity, state, value, baseline, "
        f"threshold, message, episode, last_step, {_seconds('updated_at')} FROM anomalies {where} ORDER BY time",
    }


def write(table: pa.Table, path: Path) -> None:
    """zstd Parquet; float columns byte-stream-split (noisy float64s compress about twice as well)."""
    floats = [f.name for f in table.schema if pa.types.is_floating(f.type)]
    pq.write_table(table, path, compression="zstd", compression_level=19, use_byte_stream_split=floats or False)


def export(db: Path, run_id: str, out: Path) -> dict[str, int]:
    """Write the run's tables into ``out``; returns rows per table."""
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    with duckdb.connect(str(db), read_only=True) as con:
        for name, sql in _queries(con, run_id).items():
            table = con.sql(sql).to_arrow_table()
            write(table, out / f"{name}.parquet")
            rows[name] = table.num_rows
    return rows
