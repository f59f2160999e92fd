"""Read-only SQL (``daemon/store/query.py``): one SELECT only, no file access, row limits, timeouts, answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import msgspec
import pytest

from trainvigil.daemon.store.query import answer, check_read_only, open_read_only, run_query
from trainvigil.errors import QueryError, QueryRefusedError
from trainvigil.schemas.query import QueryRequest


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect(":memory:")
    yield c
    c.close()


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM t",
        "INSERT INTO t VALUES (1)",
        "UPDATE t SET i = 1",
        "COPY t TO '/tmp/out.csv'",
        "ATTACH '/tmp/other.duckdb' AS other",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "PRAGMA enable_profiling",
        "CREATE TABLE x (i INTEGER)",
        "DROP TABLE t",
        "EXPORT DATABASE '/tmp/dump'",
        "SELECT 1; DELETE FROM t",
        "SELECT 1; SELECT 2",
        "",
        "   \n\t",
        "SELEC 1",
    ],
)
def test_check_read_only_refuses_everything_but_one_select(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    with pytest.raises(QueryRefusedError):
        check_read_only(con, sql)


def test_check_read_only_names_the_refused_statement_kind(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryRefusedError, match="DELETE"):
        check_read_only(con, "delete from t")


def test_check_read_only_refuses_multiple_statements_with_a_clear_message(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryRefusedError, match="one statement"):
        check_read_only(con, "select 1; select 2")


@pytest.mark.parametrize(
    "sql",
    ["SELECT 1", "select * from t where i > 3;", "WITH a AS (SELECT 1 AS x) SELECT x FROM a", "FROM t LIMIT 1"],
)
def test_check_read_only_accepts_select_and_with(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    check_read_only(con, sql)


@pytest.fixture
def ro_db(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    path = tmp_path / "vigil.duckdb"
    writer = duckdb.connect(str(path))
    writer.execute("CREATE TABLE t AS SELECT range AS i, 'row ' || range AS s, range * 0.5 AS f FROM range(5000)")
    writer.execute("CREATE TABLE d AS SELECT DATE '2024-01-02' AS day, 1.25::DECIMAL(5, 2) AS dec")
    writer.close()
    ro = open_read_only(str(path))
    yield ro
    ro.close()


@pytest.mark.parametrize(
    "sql",
    [
        "select * from read_csv('/etc/passwd')",
        "select * from read_text('/etc/passwd')",
        "select * from read_parquet('/etc/passwd')",
        "select * from read_csv('https://example.com/data.csv')",
        "select * from glob('/etc/*')",
    ],
)
def test_run_query_refuses_file_access_from_select(ro_db: duckdb.DuckDBPyConnection, sql: str) -> None:
    with pytest.raises(QueryRefusedError, match="disabled"):
        run_query(ro_db, sql, limit=10, timeout=10)


def test_run_query_cannot_turn_external_access_back_on(ro_db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryRefusedError):
        run_query(ro_db, "SET enable_external_access = true", limit=10, timeout=10)
    with pytest.raises(duckdb.Error):  # the configuration is locked even outside check_read_only
        ro_db.execute("SET enable_external_access = true")


def test_run_query_enforces_the_row_limit_and_flags_truncation(ro_db: duckdb.DuckDBPyConnection) -> None:
    result = run_query(ro_db, "select i, s from t order by i", limit=100, timeout=10)
    assert len(result.rows) == 100
    assert result.truncated
    assert result.columns == ["i", "s"]
    assert result.types == ["BIGINT", "VARCHAR"]
    assert result.rows[:2] == [[0, "row 0"], [1, "row 1"]]


def test_run_query_exactly_at_the_limit_is_not_truncated(ro_db: duckdb.DuckDBPyConnection) -> None:
    result = run_query(ro_db, "select i from t where i < 100", limit=100, timeout=10)
    assert len(result.rows) == 100
    assert not result.truncated


def test_run_query_makes_dates_and_decimals_plain_strings(ro_db: duckdb.DuckDBPyConnection) -> None:
    result = run_query(ro_db, "select * from d", limit=10, timeout=10)
    assert result.rows == [["2024-01-02", "1.25"]]
    msgspec.msgpack.encode(result)


def test_run_query_bad_sql_raises_query_error(ro_db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryError, match="no_such_table"):
        run_query(ro_db, "select * from no_such_table", limit=10, timeout=10)


def test_run_query_interrupts_a_query_past_its_timeout(ro_db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryError, match="interrupted"):
        run_query(ro_db, "select count(*) from range(100000000) a, range(100000000) b", limit=10, timeout=0.2)


def test_answer_folds_refusals_and_errors_into_the_result(ro_db: duckdb.DuckDBPyConnection) -> None:
    refused = answer(ro_db, QueryRequest(sql="delete from t"), max_limit=10, timeout=10)
    assert refused.refused and refused.error
    failed = answer(ro_db, QueryRequest(sql="select nope from t"), max_limit=10, timeout=10)
    assert not failed.refused and failed.error
    capped = answer(ro_db, QueryRequest(sql="select * from t", limit=10_000), max_limit=7, timeout=10)
    assert len(capped.rows) == 7 and capped.truncated
