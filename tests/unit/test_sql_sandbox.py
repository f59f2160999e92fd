"""The read-only SQL sandbox against a real store file: no write form gets through, budgets cut answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pytest

from trainvigil.daemon.cli.main import EXIT_USAGE, main
from trainvigil.daemon.config import DaemonConfig, load
from trainvigil.daemon.store import query as query_mod
from trainvigil.daemon.store.query import answer, run_query
from trainvigil.daemon.store.writer import Store
from trainvigil.errors import ConfigError, QueryError, QueryRefusedError
from trainvigil.schemas.query import QueryRequest, QueryResult, validate

ROWS = 200


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One store file for the module (opening one costs ~0.2 s): every test that could write compares
    snapshots taken before and after, so a write that got through still fails the test that made it."""
    s = Store(tmp_path_factory.mktemp("sandbox") / "vigil.duckdb")
    s.con.execute(
        "INSERT INTO steps (run_id, rank, step, time, loss) "
        f"SELECT 'r' || (i % 2), 0, i, TIMESTAMP '2024-01-01' + i * INTERVAL 1 SECOND, i * 0.5 FROM range({ROWS}) t(i)"
    )
    s.con.execute("INSERT INTO runs (run_id, status, world_size) VALUES ('r0', 'ok', 1), ('r1', 'running', 1)")
    s.con.execute("CREATE SEQUENCE seq")
    s.con.execute("SELECT nextval('seq')")
    yield s
    s.close()


@pytest.fixture
def cursor(store: Store) -> Iterator[duckdb.DuckDBPyConnection]:
    c = store.cursor()
    yield c
    c.close()


def _snapshot(store: Store) -> dict[str, Any]:
    """Everything a write could change: row counts, the catalog, sequences, macros, attached databases."""
    con = store.cursor()
    try:
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        catalog = {
            "counts": {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone() for t in tables},
            "steps": con.execute("SELECT sum(loss), min(step), max(step) FROM steps").fetchall(),
        }
        for name, sql in {
            "tables": "SELECT table_catalog, table_schema, table_name, table_type FROM information_schema.tables",
            "columns": "SELECT table_name, column_name, data_type FROM duckdb_columns()",
            "sequences": "SELECT sequence_name, last_value FROM duckdb_sequences()",
            "macros": "SELECT function_name FROM duckdb_functions() WHERE function_type LIKE '%macro' AND NOT internal",
            "views": "SELECT view_name FROM duckdb_views() WHERE NOT internal",
            "indexes": "SELECT index_name FROM duckdb_indexes()",
            "types": "SELECT type_name FROM duckdb_types() WHERE NOT internal",
            "databases": "SELECT database_name FROM duckdb_databases()",
        }.items():
            catalog[name] = sorted(map(str, con.execute(sql).fetchall()))
        return catalog
    finally:
        con.close()


WRITES = [
    # data-modifying statements inside a SELECT
    "with x as (delete from steps returning *) select count(*) from x",
    "with x as (insert into runs (run_id) values ('evil') returning *) select * from x",
    "with x as (update steps set loss = 0 returning *) select count(*) from x",
    "select * from steps where step in (with d as (delete from steps returning step) select step from d)",
    "select (with d as (delete from steps returning 1) select count(*) from d)",
    "select * from (with d as (delete from steps returning *) select * from d) t",
    "with a as (select 1), b as (delete from runs returning *) select * from a",
    "with x as (copy steps to '{tmp}/cte.csv') select * from x",
    # plain writes
    "delete from steps",
    "delete from steps returning *",
    "insert into steps select * from steps",
    "insert into runs (run_id) values ('evil') returning *",
    "update steps set loss = 0",
    "update steps set loss = 0 from runs where steps.run_id = runs.run_id",
    "merge into runs using (select 'evil' as run_id) s on runs.run_id = s.run_id "
    "when not matched then insert (run_id) values (s.run_id)",
    "truncate steps",
    "create table t2 as select * from steps",
    "create or replace table steps as select 1 as x",
    "create temp table t2 as select 1 as x",
    "create view v as select 1 as x",
    "create macro m(x) as x + 1",
    "create sequence seq2",
    "create type mood as enum ('a', 'b')",
    "create index i on steps (step)",
    "drop table steps",
    "drop sequence seq",
    "alter table steps add column evil integer",
    "alter table steps rename to s2",
    "comment on table steps is 'evil'",
    # sequences and state-changing functions inside a SELECT
    "select nextval('seq')",
    "select setval('seq', 100)",
    "select * from checkpoint()",
    "select * from force_checkpoint()",
    "select * from query('with x as (delete from steps returning *) select count(*) from x')",
    "select * from json_execute_serialized_sql(json_serialize_sql('select 1'))",
    "select * from enable_profiling()",
    # session, storage and catalog statements
    "pragma enable_profiling",
    "pragma threads=1",
    "set threads = 1",
    "set enable_external_access = true",
    "set variable x = 1",
    "reset threads",
    "call checkpoint()",
    "call force_checkpoint()",
    "checkpoint",
    "force checkpoint",
    "vacuum",
    "vacuum steps",
    "analyze",
    "export database '{tmp}/dump'",
    "import database '{tmp}/dump'",
    "attach ':memory:' as other",
    "detach database if exists other",
    "copy steps to '{tmp}/steps.csv'",
    "copy steps from '{tmp}/steps.csv'",
    "install httpfs",
    "load httpfs",
    "use memory",
    "begin transaction",
    "commit",
    "rollback",
    "pivot steps on rank using sum(loss)",
    "explain analyze delete from steps",
    # several statements, and statements after comments
    "select 1; delete from steps",
    "delete from steps; select 1",
    "select 1; select 2",
    "select 1 -- comment\n; delete from steps",
    "select 1 /* a comment */; delete from steps",
]


@pytest.mark.parametrize("sql", WRITES)
def test_every_write_form_is_refused_and_changes_nothing(store: Store, tmp_path: Path, sql: str) -> None:
    before = _snapshot(store)
    cursor = store.cursor()
    try:
        result = answer(cursor, QueryRequest(sql=sql.format(tmp=tmp_path)), max_limit=100, timeout=10)
    finally:
        cursor.close()
    assert result.refused, (sql, result)
    assert result.error and not result.rows
    assert _snapshot(store) == before
    assert not list(tmp_path.glob("*.csv")) and not (tmp_path / "dump").exists(), "no file was written"


def test_a_refused_cte_write_names_what_it_found(cursor: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryRefusedError, match="DELETE"):
        run_query(cursor, "with x as (delete from steps returning *) select count(*) from x", limit=10, timeout=10)
    with pytest.raises(QueryRefusedError, match="nextval"):
        run_query(cursor, "select nextval('seq')", limit=10, timeout=10)


@pytest.mark.parametrize(
    "sql",
    ["select 1 /* ; delete from steps */", "select 1 -- ; delete from steps", "/* delete from steps; */ select 1"],
)
def test_comments_hide_nothing_only_the_select_runs(store: Store, cursor: duckdb.DuckDBPyConnection, sql: str) -> None:
    before = _snapshot(store)
    assert run_query(cursor, sql, limit=10, timeout=10).rows == [[1]]
    assert _snapshot(store) == before


def test_the_transaction_is_rolled_back_even_if_the_check_let_a_write_through(
    store: Store, cursor: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second lock on its own: a write that passes the check is undone with the transaction."""
    monkeypatch.setattr(query_mod, "check_read_only", lambda con, sql: con.extract_statements(sql)[0])
    before = _snapshot(store)
    result = run_query(cursor, "with x as (delete from steps returning *) select count(*) from x", limit=10, timeout=10)
    assert result.rows == [[ROWS]], "the delete ran inside the query's transaction"
    assert _snapshot(store) == before, "and was rolled back"


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        ("select count(*) from steps s join runs r using (run_id)", [[ROWS]]),
        (
            "with t as (select run_id, max(step) m from steps group by 1) select * from t order by 1",
            [["r0", 198], ["r1", 199]],
        ),
        (
            "select step, sum(loss) over (order by step rows 1 preceding) w from steps order by step limit 2",
            [[0, 0.0], [1, 0.5]],
        ),
        (
            "with recursive t(n) as (select 1 union all select n + 1 from t where n < 3) select * from t",
            [[1], [2], [3]],
        ),
        ("select run_id from runs union all select 'x' order by 1", [["r0"], ["r1"], ["x"]]),
        ("from runs select run_id order by run_id limit 1", [["r0"]]),
        ("select sum(step) from steps", [[ROWS * (ROWS - 1) // 2]]),
        ("select 1 as a, 2 as a", [[1, 2]]),
        (
            "select {'k': [1, 2]} s, map(['a'], [1.5::double]) m, [1, null] l, 'x'::blob b",
            [[{"k": [1, 2]}, {"a": 1.5}, [1, None], b"x"]],
        ),
        ("select date '2024-01-02' d, 1.25::decimal(5, 2) n, interval 1 day i", [["2024-01-02", "1.25", "1 day"]]),
        ("select timestamptz '2024-01-01 12:00:00+00' > timestamptz '2023-01-01 00:00:00+00'", [[True]]),
        ("select * from query_table('runs') order by run_id limit 1", [["r0", None, None, 1, "ok", None, None]]),
    ],
)
def test_ordinary_selects_still_work(cursor: duckdb.DuckDBPyConnection, sql: str, rows: list[list[Any]]) -> None:
    result = run_query(cursor, sql, limit=100, timeout=10)
    assert result.rows == rows
    assert not result.truncated and not result.note
    msgspec.msgpack.encode(result)


def test_time_zone_aware_values_need_no_pytz(cursor: duckdb.DuckDBPyConnection) -> None:
    result = run_query(
        cursor, "select now() as t, [now()] as l, timestamp_ns '2024-01-01 00:00:00.123456789' ns", 10, 10
    )
    assert result.types == ["TIMESTAMP WITH TIME ZONE", "TIMESTAMP WITH TIME ZONE[]", "TIMESTAMP_NS"]
    t, lst, ns = result.rows[0]
    assert isinstance(t, str) and t.startswith("20") and isinstance(lst, str)
    assert ns == "2024-01-01 00:00:00.123456789"


def test_row_limit_cuts_the_answer_with_a_note(cursor: duckdb.DuckDBPyConnection) -> None:
    result = run_query(cursor, "select step from steps order by step", limit=50, timeout=10)
    assert [r[0] for r in result.rows] == list(range(50))
    assert result.truncated and result.note.startswith("truncated at 50 rows")


def test_byte_budget_cuts_the_answer_while_rows_stream(cursor: duckdb.DuckDBPyConnection) -> None:
    result = run_query(cursor, "select repeat('x', 1000) from range(1000)", limit=10_000, timeout=10, max_bytes=50_000)
    assert result.truncated and result.note.startswith("truncated at ")
    assert "bytes" in result.note and "query_max_bytes" in result.note
    size = sum(len(msgspec.msgpack.encode(r)) for r in result.rows)
    assert 40_000 < size <= 50_000
    assert f"truncated at {size} bytes ({len(result.rows)} rows)" in result.note


def test_one_row_larger_than_the_byte_budget_is_never_converted(cursor: duckdb.DuckDBPyConnection) -> None:
    started = time.monotonic()
    result = run_query(cursor, "select list(i) from range(3000000) t(i)", 10, 10, max_bytes=1 << 20)
    assert result.truncated and result.note.startswith("truncated at 0 bytes (0 rows)") and result.rows == []
    assert time.monotonic() - started < 5


def test_a_query_that_grows_the_process_is_interrupted(cursor: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryError, match="query_memory_bytes"):
        run_query(cursor, "select list(i) from range(100000000) t(i)", 10, 30, memory_bytes=64 << 20)


def test_a_query_that_spills_to_disk_is_interrupted(tmp_path: Path) -> None:
    con = duckdb.connect(
        str(tmp_path / "spill.duckdb"), config={"memory_limit": "64MB", "temp_directory": str(tmp_path / "tmp")}
    )
    try:
        with pytest.raises(QueryError, match="query_spill_bytes"):
            run_query(
                con, "select count(*) from range(1000000000) a, range(1000000000) b", 10, 30, spill_bytes=32 << 20
            )
    finally:
        con.close()


def test_the_timeout_interrupts_and_the_connection_stays_usable(cursor: duckdb.DuckDBPyConnection) -> None:
    started = time.monotonic()
    with pytest.raises(QueryError, match=r"interrupted after 0.3 s"):
        run_query(cursor, "select sum(i) from range(100000000000) t(i)", limit=10, timeout=0.3)
    assert time.monotonic() - started < 5
    assert run_query(cursor, "select count(*) from steps", limit=10, timeout=10).rows == [[ROWS]]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"limit": -2}, "limit"),
        ({"limit": 0}, "limit"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"timeout_s": float("nan")}, "timeout_s"),
        ({"sql": "select 1" + " " * query_mod.MAX_SQL_CHARS}, "sql"),
    ],
)
def test_out_of_range_requests_are_refused_at_once(
    cursor: duckdb.DuckDBPyConnection, fields: dict[str, Any], field: str
) -> None:
    request = QueryRequest(**{"sql": "select 1", **fields})
    started = time.monotonic()
    result = answer(cursor, request, max_limit=100, timeout=10)
    assert result.refused and f"$.{field}" in result.error, result.error
    assert time.monotonic() - started < 1
    with pytest.raises(msgspec.ValidationError, match=field):  # as the responder decodes it off the wire
        msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=QueryRequest)
    with pytest.raises(QueryRefusedError, match="bad query request"):
        validate(request)


def test_budgets_above_the_daemons_are_lowered_to_them(cursor: duckdb.DuckDBPyConnection) -> None:
    request = QueryRequest(sql="select step from steps", limit=10_000, max_bytes=1 << 30, timeout_s=1e9)
    result = answer(cursor, request, max_limit=7, timeout=10, max_bytes=1 << 20)
    assert len(result.rows) == 7 and result.truncated


@pytest.mark.parametrize("bad", [{"limit": 0}, {"max_bytes": -1}, {"timeout": 0.0}])
def test_run_query_refuses_budgets_below_one(cursor: duckdb.DuckDBPyConnection, bad: dict[str, Any]) -> None:
    args: dict[str, Any] = {"limit": 10, "timeout": 10.0, **bad}
    with pytest.raises(QueryRefusedError, match="at least 1"):
        run_query(cursor, "select 1", **args)


def test_cli_negative_limit_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", "select 1", "--limit", "-2"]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "--limit" in err and "-2" in err


@pytest.mark.parametrize("key", ["query_max_bytes", "query_memory_bytes", "query_spill_bytes", "query_concurrency"])
def test_query_settings_below_one_are_configuration_errors(key: str) -> None:
    assert getattr(DaemonConfig(), key) >= 1
    with pytest.raises(ConfigError, match=key):
        load(None, env={"VIGIL_" + key.upper(): "0"})


def test_answers_carry_their_note_over_the_wire() -> None:
    result = QueryResult(columns=["a"], types=["INTEGER"], rows=[[1]], truncated=True, note="truncated at 1 rows")
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(result), type=QueryResult) == result
