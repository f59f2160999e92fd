"""``vigil export``'s paging, writing and progress against a real store file (no broker needed)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from trainvigil.daemon.cli.export import (
    TABLES,
    ExportWriteError,
    Progress,
    UnknownRunError,
    count_rows,
    export_rows,
    output,
    page_sql,
    pages,
)
from trainvigil.daemon.cli.sqlclient import QuerySource
from trainvigil.daemon.store.query import run_query
from trainvigil.daemon.store.writer import Store
from trainvigil.errors import QueryBusyError, QueryError
from trainvigil.schemas.query import QueryResult

RUN = "it's"  # a quote in the run id: literals must be escaped, not pasted


@pytest.fixture
def cursor(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    (tmp_path / "data").mkdir()
    store = Store(tmp_path / "data" / "vigil.duckdb")
    store.con.execute(
        "INSERT INTO steps (run_id, rank, step, time, loss, extra) SELECT ?, i % 3, i // 3, "
        "TIMESTAMPTZ '2024-01-01 00:00:00+00' + i * INTERVAL 1 SECOND, i / 7, map(['m'], [i * 0.5]) "
        "FROM range(100) t(i)",
        [RUN],
    )
    store.con.execute("INSERT INTO steps (run_id, rank, step) SELECT 'other', 0, i FROM range(30) t(i)")
    store.con.execute(
        "INSERT INTO events (run_id, rank, kind, step) SELECT ?, 0, 'e', i % 4 FROM range(25) t(i)", [RUN]
    )
    store.con.execute("INSERT INTO runs (run_id, status) VALUES (?, 'ok'), ('other', 'ok')", [RUN])
    c = store.cursor()
    yield c
    c.close()
    store.close()


class Asker:
    """``run_query`` on the store, as the daemon answers, with its budgets; counts the pages asked."""

    def __init__(self, con: duckdb.DuckDBPyConnection, cap: int = 10_000, max_bytes: int = 1 << 20) -> None:
        self.con, self.cap, self.max_bytes, self.calls = con, cap, max_bytes, 0

    def __call__(self, sql: str, limit: int) -> QueryResult:
        self.calls += 1
        return run_query(self.con, sql, min(limit, self.cap), 10, max_bytes=self.max_bytes)


def _rows(ask: Asker, table: str, page_rows: int) -> list[list[object]]:
    return [row for page in pages(ask, TABLES[table], RUN, page_rows) for row in page.rows]


def test_pages_hold_every_row_once_in_key_order_whatever_cuts_them(cursor: duckdb.DuckDBPyConnection) -> None:
    whole = run_query(cursor, "SELECT * FROM steps WHERE run_id = $$it's$$ ORDER BY rank, step", 1000, 10).rows
    assert len(whole) == 100
    for ask, page_rows in [(Asker(cursor), 7), (Asker(cursor, cap=5), 50), (Asker(cursor, max_bytes=900), 50)]:
        assert _rows(ask, "steps", page_rows) == whole
        assert ask.calls > 100 // page_rows


def test_a_page_ending_exactly_at_the_last_row_ends_the_export(cursor: duckdb.DuckDBPyConnection) -> None:
    ask = Asker(cursor)
    assert len(_rows(ask, "steps", 50)) == 100 and ask.calls == 2  # no empty page: the second is not cut
    ask = Asker(cursor)
    assert len(_rows(ask, "steps", 100)) == 100 and ask.calls == 1


def test_append_only_tables_page_by_rowid_without_showing_it(cursor: duckdb.DuckDBPyConnection) -> None:
    ask = Asker(cursor)
    first = next(pages(ask, TABLES["events"], RUN, 4))
    assert first.columns == ["run_id", "rank", "time", "kind", "step", "fields"]
    assert [r[4] for r in _rows(ask, "events", 4)] == [i % 4 for i in range(25)]


def test_a_row_larger_than_the_byte_budget_is_an_error_not_a_silent_end(cursor: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryError, match="query_max_bytes"):
        _rows(Asker(cursor, max_bytes=10), "steps", 50)


def test_an_empty_table_of_a_known_run_still_has_its_columns(cursor: duckdb.DuckDBPyConnection) -> None:
    out = io.StringIO()
    assert export_rows(Asker(cursor), TABLES["heartbeats"], RUN, "csv", out, page_rows=10, progress=print) == 0
    assert out.getvalue().startswith("run_id,rank,host,pid,time")


def test_count_rows_knows_unknown_runs(cursor: duckdb.DuckDBPyConnection) -> None:
    assert count_rows(Asker(cursor), TABLES["steps"], RUN) == 100
    assert count_rows(Asker(cursor), TABLES["heartbeats"], RUN) == 0
    with pytest.raises(UnknownRunError, match="vigil runs"):
        count_rows(Asker(cursor), TABLES["steps"], "nope")


def test_page_sql_escapes_the_run_and_continues_after_the_last_key() -> None:
    sql = page_sql(TABLES["steps"], "a'b", [1, 41], 10)
    assert "run_id = 'a''b'" in sql and "(rank > 1) OR (rank = 1 AND step > 41)" in sql
    assert sql.endswith("ORDER BY rank, step LIMIT 11")


def test_csv_and_parquet_files_are_whole_and_typed(cursor: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    for fmt in ["csv", "parquet"]:
        path = tmp_path / f"x.{fmt}"
        with output(path, binary=fmt == "parquet") as out:
            export_rows(Asker(cursor), TABLES["steps"], RUN, fmt, out, page_rows=30, progress=lambda n: None)
        if fmt == "csv":
            rows = list(csv.DictReader(io.StringIO(path.read_text())))
            assert len(rows) == 100 and rows[0]["time"] == "2024-01-01 00:00:00+00" and rows[0]["loss"] == "0.0"
        else:
            table = pq.read_table(path)
            assert table.num_rows == 100 and str(table.schema.field("time").type) == "timestamp[us, tz=Etc/UTC]"
            assert dict(table.column("extra")[1].as_py()) == {"m": 1.5}  # rank 0 step 1 is i = 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "x.csv", "x.parquet"]


def test_a_failure_midway_leaves_the_target_as_it_was(cursor: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("old\n")
    inner = Asker(cursor)

    def dies_on_page_two(sql: str, limit: int) -> QueryResult:
        if inner.calls == 1:
            raise QueryError("query interrupted after 30 s (query_timeout_s)")
        return inner(sql, limit)

    with pytest.raises(QueryError), output(path, binary=False) as out:
        export_rows(dies_on_page_two, TABLES["steps"], RUN, "csv", out, page_rows=10, progress=lambda n: None)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "x.csv"]


def test_a_target_that_cannot_be_replaced_is_an_export_write_error(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    (taken / "inside").mkdir(parents=True)  # a directory where the file should go: the rename fails, even for root
    with pytest.raises(ExportWriteError, match="left as it was"), output(taken, binary=False) as out:
        out.write("a,b\n")
    assert [p.name for p in tmp_path.iterdir()] == ["taken"] and [p.name for p in taken.iterdir()] == ["inside"]


def test_progress_says_how_far_at_most_every_interval() -> None:
    quiet, chatty = io.StringIO(), io.StringIO()
    slow = Progress("export of run r (steps)", 200, interval=3600, stream=quiet)
    fast = Progress("export of run r (steps)", 200, interval=0, stream=chatty)
    for done in (50, 200):
        slow(done)
        fast(done)
    assert quiet.getvalue() == ""
    assert chatty.getvalue().splitlines() == [
        "vigil: export of run r (steps): 50 of 200 rows (25%)",
        "vigil: export of run r (steps): 200 of 200 rows (100%)",
    ]


def test_a_busy_daemon_is_waited_out_and_other_errors_are_not(tmp_path: Path) -> None:
    answers: list[Exception | QueryResult] = []

    def ask_once(sql: str, limit: int) -> QueryResult:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    source = QuerySource(nats_url="nats://127.0.0.1:1", data_dir=tmp_path, timeout=1.0)
    source._ask_once = ask_once  # type: ignore[method-assign]  # the daemon's answers, one per ask
    with source:
        answers[:] = [QueryBusyError("busy: 2 queries are running")] * 2 + [QueryResult(rows=[[1]])]
        assert source.ask("select 1", 1).rows == [[1]]
        assert answers == []
        answers[:] = [QueryError("no such table"), QueryResult()]
        with pytest.raises(QueryError, match="no such table"):
            source.ask("select 1", 1)
        assert len(answers) == 1, "an error other than busy is not asked again"
        source.busy_patience_s = 0.01
        answers[:] = [QueryBusyError("busy: 2 queries are running")] * 3
        with pytest.raises(QueryError, match="busy"):
            source.ask("select 1", 1)
