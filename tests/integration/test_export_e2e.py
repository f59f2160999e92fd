"""``vigil export`` through a real nats-server, a real daemon process and the real command line."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from inprocess import InProcessDaemon
from support import (
    Daemon,
    NatsServer,
    SqlOverNats,
    expected_loss,
    finish,
    run_producer,
    serving,
    vigil,
    vigil_together,
    wait_for,
)

from trainvigil.daemon.cli.main import EXIT_OK, EXIT_USAGE
from trainvigil.daemon.cli.replay import batches, read_directory
from trainvigil.schemas import Heartbeat, RunEnd
from trainvigil.schemas.records import KNOWN_METRICS

STEPS, RANKS = 1500, 2  # 3000 rows against a row limit of 1000: at least three pages, split across ranks
STEP_COLUMNS = ["run_id", "rank", "step", "time", *KNOWN_METRICS, "extra"]  # the order of the steps table


def _fill(daemon: SqlOverNats, url: str) -> None:
    producers = [run_producer(url, "ex", rank, STEPS) for rank in range(RANKS)] + [run_producer(url, "other", 0, 50)]
    for proc in producers:
        finish(proc)
    wait_for(lambda: daemon.scalar("select count(*) from steps") == STEPS * RANKS + 50, 60, "every step stored")


ROW_LIMIT = {"VIGIL_QUERY_ROW_LIMIT": "1000"}
"""The small daemon's answers hold 1000 rows at most."""


@pytest.fixture(scope="module")
def small_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with :data:`ROW_LIMIT` holding run ``ex`` (3000 steps) and ``other``, on a broker of its own: filled
    once for the tests that only read it (each writes its export to a path of its own)."""
    with serving(tmp_path_factory.mktemp("export"), ROW_LIMIT) as d:
        _fill(d, d.nats_url)
        yield d


def _check_steps(rows: list[dict[str, object]]) -> None:
    """Every step of run ``ex`` once, in (rank, step) order, with the producer's exact values."""
    assert [(r["rank"], r["step"]) for r in rows] == [(k, s) for k in range(RANKS) for s in range(STEPS)]
    assert {r["run_id"] for r in rows} == {"ex"}
    assert all(r["loss"] == expected_loss(int(str(r["rank"])), int(str(r["step"]))) for r in rows)


def test_csv_export_holds_every_row_of_the_run_past_the_row_limit(small_daemon: Daemon) -> None:
    done = vigil("export", "ex", "--nats", small_daemon.nats_url)
    assert done.returncode == EXIT_OK, done.stderr
    table = list(csv.DictReader(io.StringIO(done.stdout)))
    assert list(table[0]) == STEP_COLUMNS  # the table's columns, not the paging key
    _check_steps([{**r, "rank": int(r["rank"]), "step": int(r["step"]), "loss": float(r["loss"])} for r in table])
    assert done.stderr.strip().endswith(f"exported {STEPS * RANKS} rows of run ex (steps) to stdout"), done.stderr


def test_parquet_export_keeps_duckdbs_types(small_daemon: Daemon, tmp_path: Path) -> None:
    target = tmp_path / "ex.parquet"
    done = vigil("export", "ex", "--format", "parquet", "-o", str(target), "--nats", small_daemon.nats_url)
    assert done.returncode == EXIT_OK, done.stderr
    table = pq.read_table(target)
    assert table.column_names == STEP_COLUMNS
    assert table.schema.field("rank").type == pa.int32() and table.schema.field("step").type == pa.int64()
    assert table.schema.field("time").type == pa.timestamp("us", tz="Etc/UTC")
    assert table.schema.field("extra").type == pa.map_(pa.string(), pa.float64())
    rows = table.to_pylist()
    _check_steps(rows)
    assert dict(rows[7]["extra"]) == {"my_custom": 3.5}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".ex.parquet")) == [], "no temp file left"


def test_pages_cut_by_the_byte_budget_are_continued(nats_server: NatsServer, tmp_path: Path) -> None:
    d = InProcessDaemon(nats_server.url, tmp_path / "bytes", env={"VIGIL_QUERY_MAX_BYTES": "20000"})
    d.start()
    try:
        _fill(d, nats_server.url)
        done = vigil("export", "ex", "--format", "csv", "--nats", nats_server.url)
    finally:
        d.close()
    assert done.returncode == EXIT_OK, done.stderr
    table = list(csv.DictReader(io.StringIO(done.stdout)))
    _check_steps([{**r, "rank": int(r["rank"]), "step": int(r["step"]), "loss": float(r["loss"])} for r in table])


def test_other_tables_export_by_their_own_key(small_daemon: Daemon) -> None:
    done = vigil("export", "ex", "--table", "events", "--nats", small_daemon.nats_url)
    assert done.returncode == EXIT_OK, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert sorted((r["rank"], r["kind"]) for r in rows) == [
        ("0", "run_end"), ("0", "run_start"), ("1", "run_end"), ("1", "run_start"),
    ]  # fmt: skip
    assert list(rows[0]) == ["run_id", "rank", "time", "kind", "step", "fields"]


def test_an_unknown_run_is_a_clear_error_and_leaves_the_file_alone(small_daemon: Daemon, tmp_path: Path) -> None:
    target = tmp_path / "keep.csv"
    target.write_text("old contents\n")
    done = vigil("export", "no-such-run", "-o", str(target), "--nats", small_daemon.nats_url)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr == "vigil: run 'no-such-run' is not in the history; list the runs with `vigil runs`\n"
    assert target.read_text() == "old contents\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".keep.csv")] == [], "no temp file left"


def test_o_replaces_the_file_whole(small_daemon: Daemon, tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    target.write_text("old contents\n")
    done = vigil("export", "ex", "-o", str(target), "--nats", small_daemon.nats_url)
    assert done.returncode == EXIT_OK and done.stdout == "", done.stderr
    assert len(target.read_text().splitlines()) == 1 + STEPS * RANKS
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_without_a_daemon_the_file_is_read(private_nats_server: NatsServer, tmp_path: Path) -> None:
    d = InProcessDaemon(private_nats_server.url, tmp_path / "data", env=ROW_LIMIT)  # its own: this test stops it
    d.start()
    try:
        _fill(d, private_nats_server.url)
    finally:
        assert d.terminate() == 0
    private_nats_server.stop()
    target = tmp_path / "offline.parquet"
    done = vigil(
        "export", "ex", "--format", "parquet", "-o", str(target),
        "--nats", private_nats_server.url, "--data-dir", str(d.data_dir),
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr
    assert "no daemon answered" in done.stderr and "vigil.duckdb" in done.stderr
    _check_steps(pq.read_table(target).to_pylist())


def test_export_usage_errors_and_help(tmp_path: Path) -> None:
    usage = [(["--format", "parquet"], "-o FILE"), (["-o", str(tmp_path / "missing" / "x.csv")], "does not exist")]
    where = ["--nats", "nats://127.0.0.1:1", "--data-dir", str(tmp_path)]
    helped, *done = vigil_together(["export", "--help"], *[["export", "ex", *args, *where] for args, _ in usage])
    assert helped.returncode == 0 and "usage: vigil export" in helped.stdout, helped.stderr
    codes = helped.stdout.partition("exit codes:")[2]
    assert all(f"  {code}  " in codes for code in (0, 1, 2, 3)), helped.stdout  # the exit-code table's rows
    for (_, says), refused in zip(usage, done, strict=True):
        assert refused.returncode == EXIT_USAGE and says in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr


def test_an_exported_run_replays_with_its_events_and_heartbeats(small_daemon: Daemon, tmp_path: Path) -> None:
    """``vigil export`` of steps, events and heartbeats into one directory, then ``vigil replay DIR``:
    the timestamps and the ``extra`` map come back as replay reads them, and the run ends as recorded."""
    run, where = tmp_path / "ex", ["--nats", small_daemon.nats_url]
    run.mkdir()
    exports = [
        ["export", "ex", "--table", table, "--format", "parquet", "-o", str(run / f"{table}.parquet"), *where]
        for table in ("steps", "events", "heartbeats")
    ]
    for done in vigil_together(*exports):
        assert done.returncode == EXIT_OK, done.stderr
    replayed = vigil("replay", str(run))
    assert replayed.returncode == EXIT_OK, replayed.stderr
    steps, records = read_directory(run)
    assert steps.num_rows == STEPS * RANKS
    (part,) = [p for p in next(batches(steps, batch_steps=STEPS * 2, records=records)).steps if p.source.rank == 0]
    sql = "select epoch_us(time) from steps where run_id = 'ex' and rank = 0 order by step limit 1000"
    stored = [row[0] / 1e6 for row in small_daemon.sql(sql).rows]
    assert np.allclose(part.times[:1000], stored, rtol=0, atol=1e-6), "timestamps as Unix seconds"
    assert part.known["loss"][0][:3].tolist() == [expected_loss(0, s) for s in range(3)]
    ends = sorted((source.rank, record.status) for source, record in records if isinstance(record, RunEnd))
    assert ends == [(0, "ok"), (1, "ok")], "each rank ends when its recorded run_end says"
    beats = [record for _, record in records if isinstance(record, Heartbeat)]
    # As many as were stored: a quick run may end before its first heartbeat (the interval is seconds).
    assert len(beats) == small_daemon.scalar("select count(*) from heartbeats where run_id = 'ex'")
    assert all(b.last_step is None or b.last_step < STEPS for b in beats)
