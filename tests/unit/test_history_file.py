"""The history file stays readable by the tools people use.

A file the store writes opens in a DuckDB 1.x CLI (``duckdb-cli`` from PyPI, the ``dev`` extra);
times are TIMESTAMPTZ instants; every table and column says what it holds and in which unit;
``run_summary`` and ``open_alerts`` answer the common questions; a file of schema version 1 is
migrated on open and goes on ingesting.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from trainvigil.daemon.batch.decode import IngestBatch, RawMessage, decode_batch
from trainvigil.daemon.store._arrow import STEP_COLUMNS as _STEP_FIELDS
from trainvigil.daemon.store.schema import SCHEMA_VERSION, STORAGE_VERSION
from trainvigil.daemon.store.writer import Store
from trainvigil.errors import ConfigError
from trainvigil.schemas import DEFAULT_SUBJECTS, Anomaly, Envelope, RunEnd, RunStart, Source, StepBatch, encode
from trainvigil.schemas.records import Column

T = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC

V1_DDL = """
CREATE TABLE schema_info (version INTEGER);
CREATE TABLE runs (
    run_id VARCHAR PRIMARY KEY, first_seen TIMESTAMP, last_seen TIMESTAMP, world_size INTEGER, status VARCHAR,
    ended_at TIMESTAMP, argv JSON
);
CREATE TABLE steps (
    run_id VARCHAR NOT NULL, rank INTEGER NOT NULL, step BIGINT NOT NULL, time TIMESTAMP,
    loss DOUBLE, grad_norm DOUBLE, lr DOUBLE, step_time DOUBLE, samples DOUBLE, tokens DOUBLE, reward DOUBLE,
    entropy DOUBLE, kl DOUBLE, extra MAP(VARCHAR, DOUBLE)
);
CREATE TABLE events (run_id VARCHAR, rank INTEGER, time TIMESTAMP, kind VARCHAR, step BIGINT, fields JSON);
CREATE TABLE heartbeats (
    run_id VARCHAR, rank INTEGER, host VARCHAR, pid INTEGER, time TIMESTAMP, last_step BIGINT,
    buffered BIGINT, spilled_bytes BIGINT, connected BOOLEAN, dropped JSON
);
CREATE TABLE gil_samples (
    run_id VARCHAR, rank INTEGER, time TIMESTAMP, period DOUBLE, samples INTEGER,
    wait_p50 DOUBLE, wait_p90 DOUBLE, wait_p99 DOUBLE, wait_max DOUBLE,
    busy_share DOUBLE, wait_share DOUBLE, held DOUBLE, switch_interval DOUBLE, gil_enabled BOOLEAN, threads JSON
);
CREATE TABLE checkpoints (
    run_id VARCHAR, rank INTEGER, time TIMESTAMP, step BIGINT, origin VARCHAR, path VARCHAR,
    algo VARCHAR, root VARCHAR, ok BOOLEAN, tensors JSON
);
CREATE TABLE anomalies (
    run_id VARCHAR, rank INTEGER, step BIGINT, time TIMESTAMP, detector VARCHAR, severity VARCHAR,
    state VARCHAR, value DOUBLE, baseline DOUBLE, threshold DOUBLE, message VARCHAR,
    episode VARCHAR, last_step BIGINT, updated_at TIMESTAMP
);
CREATE TABLE canary_results (
    time TIMESTAMP, name VARCHAR, fault VARCHAR, passed BOOLEAN, expected_detector VARCHAR,
    fault_step BIGINT, fired_step BIGINT, latency_steps BIGINT, detail VARCHAR
);
CREATE TABLE dead_letters (time TIMESTAMP, subject VARCHAR, stream_seq BIGINT, reason VARCHAR, error VARCHAR, raw BLOB);
CREATE TABLE data_loss (
    time TIMESTAMP, stream VARCHAR, first_seq BIGINT, last_seq BIGINT, count BIGINT, reason VARCHAR
);
CREATE TABLE ingest_offsets (consumer VARCHAR PRIMARY KEY, stream VARCHAR, last_seq BIGINT, updated_at TIMESTAMP);
INSERT INTO schema_info VALUES (1);
"""
"""The schema trainvigil wrote before TIMESTAMPTZ (schema version 1)."""


def _steps(run_id: str, first: int, n: int, rank: int = 0, world_size: int = 2) -> bytes:
    steps = np.arange(first, first + n, dtype="<i8")
    batch = StepBatch(
        time=T,
        step=steps.tobytes(),
        times=(T + steps.astype("<f8")).tobytes(),
        columns={"loss": Column(values=(steps * 0.5).astype("<f8").tobytes())},
    )
    return encode(Envelope(source=Source(run_id=run_id, rank=rank, world_size=world_size), records=[batch]))


def _run(run_id: str, record: Any) -> bytes:
    return encode(Envelope(source=Source(run_id=run_id, world_size=2), records=[record]))


def _alert(state: str, at: float, episode: str = "e1", run_id: str = "r1") -> Anomaly:
    return Anomaly(
        time=at, run_id=run_id, rank=0, step=5, detector="loss_spike", severity="warn", state=state, episode=episode
    )


def _write(store: Store, msgs: list[tuple[str, bytes]], anomalies: Sequence[Anomaly] = ()) -> None:
    raw = [RawMessage(subject, data, store.last_seq + i) for i, (subject, data) in enumerate(msgs, start=1)]
    batch = decode_batch(raw)
    batch.anomalies.extend(anomalies)
    store.write(batch)


def _history(path: Path) -> None:
    """Two runs over two opens of the store: steps of two ranks, an end, alerts, a dead letter."""
    store = Store(path)
    metrics = DEFAULT_SUBJECTS.data("r1", "metrics")
    _write(
        store,
        [
            (DEFAULT_SUBJECTS.data("r1", "run"), _run("r1", RunStart(time=T, argv=["train.py"]))),
            (metrics, _steps("r1", 0, 10)),
            (metrics, _steps("r1", 0, 10, rank=1)),
            (metrics, b"\x00 not msgpack"),
        ],
        [_alert("open", T + 5), _alert("open", T + 6, episode="e2")],
    )
    store.close()
    store = Store(path)
    _write(
        store,
        [
            (metrics, _steps("r1", 10, 5)),
            (DEFAULT_SUBJECTS.data("r1", "run"), _run("r1", RunEnd(time=T + 20, status="ok", last_step=14))),
            (DEFAULT_SUBJECTS.data("ctl", "metrics"), _steps("ctl", 0, 3, world_size=1)),
        ],
        [_alert("cleared", T + 30, episode="e2")],
    )
    store.close()


@pytest.fixture
def history(tmp_path: Path) -> Path:
    path = tmp_path / "vigil.duckdb"
    _history(path)
    return path


@pytest.fixture
def con(history: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect(str(history), read_only=True)
    yield c
    c.close()


def _cli() -> Path:
    """The ``duckdb`` binary of the ``duckdb-cli`` distribution (not whatever ``duckdb`` is on PATH)."""
    try:
        files = importlib.metadata.files("duckdb-cli") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the DuckDB CLI is not installed: pip install -e '.[dev]' installs duckdb-cli")
    (binary,) = [Path(str(f.locate())).resolve() for f in files if f.name == "duckdb"]
    return binary


def test_a_duckdb_1x_cli_reads_the_history_file(history: Path) -> None:
    cli = str(_cli())
    version = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
    assert version.startswith("v1."), f"the dev extra pins a 1.x CLI, got {version}"
    sql = (
        "SET TimeZone = 'UTC'; "
        "SELECT run_id, status, world_size, first_seen, ended_at, steps, last_step, open_alerts, dead_letters "
        "FROM run_summary ORDER BY run_id; "
        "SELECT episode, state, time FROM open_alerts; "
        "SELECT comment FROM duckdb_columns() WHERE table_name = 'steps' AND column_name = 'step_time';"
    )
    result = subprocess.run(
        [cli, "-readonly", "-csv", str(history), "-c", sql], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "run_id,status,world_size,first_seen,ended_at,steps,last_step,open_alerts,dead_letters",
        "ctl,running,1,2023-11-14 22:13:20+00,NULL,3,2,0,0",
        "r1,ok,2,2023-11-14 22:13:20+00,2023-11-14 22:13:40+00,25,14,1,1",
        "episode,state,time",
        "e1,open,2023-11-14 22:13:25+00",
        "comment",
        '"duration of the step, seconds"',
    ]


def test_new_files_are_written_in_the_storage_format_of_duckdb_1_4(con: duckdb.DuckDBPyConnection) -> None:
    [(tags,)] = con.execute("SELECT tags FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
    assert STORAGE_VERSION == "v1.4.0" and tags["storage_version"] == "v1.4.0+"


def test_every_time_is_a_timestamptz_instant(con: duckdb.DuckDBPyConnection) -> None:
    types = con.execute(
        "SELECT DISTINCT data_type FROM duckdb_columns() WHERE data_type LIKE 'TIMESTAMP%' AND NOT internal"
    ).fetchall()
    assert types == [("TIMESTAMP WITH TIME ZONE",)]
    # epoch() of an instant: what the producer sent, whatever the reader's time zone.
    steps = con.execute("SELECT epoch(time) - step FROM steps WHERE run_id = 'r1' GROUP BY ALL").fetchall()
    assert steps == [(T,)]
    runs = con.execute("SELECT epoch(first_seen), epoch(last_seen), epoch(ended_at) FROM runs WHERE run_id = 'r1'")
    assert runs.fetchall() == [(T, T + 20, T + 20)]


def test_an_updated_alert_keeps_the_time_its_episode_opened(con: duckdb.DuckDBPyConnection) -> None:
    rows = con.execute("SELECT episode, state, epoch(time), epoch(updated_at) FROM anomalies ORDER BY episode")
    assert rows.fetchall() == [("e1", "open", T + 5, T + 5), ("e2", "cleared", T + 6, T + 30)]


def test_the_store_shows_times_in_utc_and_its_configuration_stays_locked(tmp_path: Path) -> None:
    store = Store(tmp_path / "vigil.duckdb")
    try:
        cursor = store.cursor()
        assert cursor.execute("SELECT current_setting('TimeZone')").fetchone() == ("UTC",)
        assert cursor.execute("SELECT (TIMESTAMPTZ '2024-01-01 12:00:00+02')::VARCHAR").fetchone() == (
            "2024-01-01 10:00:00+00",
        )
        for setting in ("TimeZone = 'Europe/Berlin'", "enable_external_access = true"):
            with pytest.raises(duckdb.InvalidInputException, match="locked"):
                cursor.execute(f"SET {setting}")
    finally:
        store.close()


def test_every_table_and_column_has_a_comment_with_units(con: duckdb.DuckDBPyConnection) -> None:
    tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE comment IS NULL").fetchall()
    assert tables == []
    views = con.execute("SELECT view_name, comment FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall()
    assert [name for name, comment in views if comment] == ["open_alerts", "run_summary"]
    columns = con.execute(
        "SELECT table_name || '.' || column_name FROM duckdb_columns() c SEMI JOIN duckdb_tables() USING (table_name) "
        "WHERE c.comment IS NULL OR c.comment = ''"
    ).fetchall()
    assert columns == []
    comments = dict(con.execute("SELECT table_name || '.' || column_name, comment FROM duckdb_columns()").fetchall())
    seconds = ["steps.step_time", "gil_samples.period", "gil_samples.wait_p99", "gil_samples.switch_interval"]
    assert all(comments[c].endswith("seconds") for c in seconds), {c: comments[c] for c in seconds}
    assert all(comments[c].endswith("bytes") for c in ["heartbeats.spilled_bytes", "dead_letters.raw"])


def test_the_steps_table_has_the_columns_the_writer_appends_in_order(con: duckdb.DuckDBPyConnection) -> None:
    names = con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = 'steps' ORDER BY column_index")
    assert [n for (n,) in names.fetchall()] == _STEP_FIELDS


@pytest.mark.parametrize("run_id", ["a b/c", "ctl", "ünï", "x" * 200])
def test_run_summary_counts_dead_letters_by_the_run_subject_token(tmp_path: Path, run_id: str) -> None:
    """A run id that maps to another subject token (escaped, reserved, too long) still finds its dead letters."""
    store = Store(tmp_path / "vigil.duckdb")
    try:
        subject = DEFAULT_SUBJECTS.data(run_id, "metrics")
        _write(
            store,
            [(subject, _steps(run_id, 0, 2)), (subject, b"\xc1"), (DEFAULT_SUBJECTS.data("other", "hb"), b"\xc1")],
        )
        rows = store.con.execute("SELECT run_id, steps, dead_letters FROM run_summary").fetchall()
        assert rows == [(run_id, 2, 1)]
    finally:
        store.close()


def _v1_file(path: Path) -> None:
    with duckdb.connect(str(path)) as con:
        con.execute(V1_DDL)
        con.execute(
            "INSERT INTO runs VALUES ('r1', TIMESTAMP '2023-11-14 22:13:20', TIMESTAMP '2023-11-14 22:13:29', 1, "
            "'running', NULL, '[\"old.py\"]')"
        )
        con.execute(
            "INSERT INTO steps (run_id, rank, step, time, loss) "
            "SELECT 'r1', 0, i, TIMESTAMP '2023-11-14 22:13:20' + i * INTERVAL 1 SECOND, 1.0 FROM range(10) t(i)"
        )
        con.execute(
            "INSERT INTO anomalies (run_id, rank, step, time, detector, severity, state, episode, updated_at) VALUES "
            "('r1', 0, 5, TIMESTAMP '2023-11-14 22:13:25', 'loss_spike', 'warn', 'open', 'e1', "
            "TIMESTAMP '2023-11-14 22:13:25')"
        )
        con.execute("INSERT INTO ingest_offsets VALUES ('vigil-daemon', 'VIGIL', 7, TIMESTAMP '2023-11-14 22:13:30')")


def test_a_version_1_file_is_migrated_and_goes_on_ingesting(tmp_path: Path) -> None:
    path = tmp_path / "vigil.duckdb"
    _v1_file(path)
    store = Store(path)
    try:
        con = store.con
        assert store.last_seq == 7
        assert con.execute("SELECT version FROM schema_info").fetchall() == [(SCHEMA_VERSION,)]
        assert con.execute(
            "SELECT count(*) FROM duckdb_columns() WHERE data_type = 'TIMESTAMP' AND NOT internal"
        ).fetchone() == (0,)
        # The naive times were UTC: as instants they are unchanged.
        assert con.execute("SELECT epoch(first_seen), epoch(last_seen) FROM runs").fetchall() == [(T, T + 9)]
        assert con.execute("SELECT min(epoch(time)), max(epoch(time)) FROM steps").fetchall() == [(T, T + 9)]

        # Ingest: steps that overlap the old rows (the merge path) and go past them, and the old alert clears.
        _write(
            store,
            [(DEFAULT_SUBJECTS.data("r1", "metrics"), _steps("r1", 8, 6, world_size=1))],
            [_alert("cleared", T + 40)],
        )
        assert store.last_seq == 8
        rows = con.execute("SELECT count(*), max(step), sum(loss) FROM steps").fetchall()
        assert rows == [(14, 13, 8 * 1.0 + sum(s * 0.5 for s in range(8, 14)))]
        alert = con.execute("SELECT state, epoch(time), epoch(updated_at) FROM anomalies").fetchall()
        assert alert == [("cleared", T + 5, T + 40)]
        summary = con.execute("SELECT steps, last_step, open_alerts, epoch(last_seen) FROM run_summary").fetchall()
        assert summary == [(14, 13, 0, T + 13)]
    finally:
        store.close()
    store = Store(path)  # a migrated file opens again as it is
    try:
        assert store.con.execute("SELECT version FROM schema_info").fetchall() == [(SCHEMA_VERSION,)]
    finally:
        store.close()


def test_a_file_of_a_newer_schema_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "vigil.duckdb"
    Store(path).close()
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE schema_info SET version = ?", [SCHEMA_VERSION + 1])
    with pytest.raises(ConfigError, match=r"newer than this trainvigil's.*upgrade trainvigil"):
        Store(path)
    with duckdb.connect(str(path)) as con:  # the refused store let go of the file
        assert con.execute("SELECT version FROM schema_info").fetchone() == (SCHEMA_VERSION + 1,)


def test_an_ingest_batch_without_messages_still_writes_alerts(tmp_path: Path) -> None:
    """Detector alerts alone (no messages) go through the same TIMESTAMPTZ conversion."""
    store = Store(tmp_path / "vigil.duckdb")
    try:
        store.write(IngestBatch(anomalies=[_alert("open", T)], max_seq=1))
        assert store.con.execute("SELECT epoch(time) FROM open_alerts").fetchall() == [(T,)]
    finally:
        store.close()


def test_the_store_connection_serializes_every_statement_the_sandbox_judges(tmp_path: Path) -> None:
    """The file's older format does not cap the connection: a write hidden in a CTE still serializes
    (so the sandbox can name it), which ``storage_compatibility_version`` on the connection would refuse."""
    store = Store(tmp_path / "vigil.duckdb")
    try:
        sql = "SELECT json_serialize_sql('WITH x AS (DELETE FROM steps) FROM x')"
        [(tree,)] = store.cursor().execute(sql).fetchall()
        assert '"error":false' in tree and "DELETE" in tree
    finally:
        store.close()
