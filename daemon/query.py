"""Read-only SQL over the store: checking, running, and the wire format of answers.

Two locks keep queries read-only. First, only plain ``SELECT`` statements pass (no
``DELETE``, ``COPY``, ``ATTACH``, ``INSTALL``, ``LOAD``, ``SET``, ``PRAGMA``...). Second,
the database is opened with ``enable_external_access = false`` and a locked
configuration, so even a ``SELECT`` cannot read files or URLs
(``read_csv('/etc/passwd')``, ``'https://...'``).
"""

from __future__ import annotations

import threading
from typing import Any

import duckdb
import msgspec

from trainvigil.errors import QueryError, QueryRefusedError

READ_ONLY_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False,
    "lock_configuration": True,
}


class QueryRequest(msgspec.Struct, frozen=True):
    sql: str
    limit: int | None = None


class QueryResult(msgspec.Struct, frozen=True):
    """An answer: column names and types, rows, and whether the row limit cut it short."""

    columns: list[str] = []
    types: list[str] = []
    rows: list[list[Any]] = []
    truncated: bool = False
    error: str = ""
    refused: bool = False
    more: bool = False
    """On the wire: more parts of this answer follow (answers are split to fit NATS messages)."""


def split_result(result: QueryResult, max_bytes: int) -> list[QueryResult]:
    """``result`` as parts whose encoded size stays under ``max_bytes`` (rows never split)."""
    parts: list[QueryResult] = []
    rows: list[list[Any]] = []
    # Column names, types and flags travel in every part; the array header takes up to 5 bytes.
    overhead = len(msgspec.msgpack.encode(msgspec.structs.replace(result, rows=[], more=True))) + 5
    size = overhead
    for row in result.rows:
        row_size = len(msgspec.msgpack.encode(row))
        if rows and size + row_size > max_bytes:
            parts.append(msgspec.structs.replace(result, rows=rows, truncated=False, more=True))
            rows, size = [], overhead
        rows.append(row)
        size += row_size
    parts.append(msgspec.structs.replace(result, rows=rows, more=False))
    return parts


def join_results(parts: list[QueryResult]) -> QueryResult:
    """The answer whose parts :func:`split_result` made."""
    return msgspec.structs.replace(parts[-1], rows=[row for p in parts for row in p.rows], more=False)


def _plain(value: Any) -> Any:
    """A value msgpack can carry: dates, decimals, UUIDs and the like become strings."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse anything but read queries.

    Raises:
        QueryRefusedError: the text is empty, does not parse, or holds a statement that is
            not a ``SELECT``.
    """
    if not sql.strip():
        raise QueryRefusedError('empty query; try: vigil sql "select * from runs"')
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefusedError(f"could not parse the query: {exc}") from None
    if not statements:
        raise QueryRefusedError("no statement in the query")
    for statement in statements:
        if statement.type != duckdb.StatementType.SELECT:
            kind = str(statement.type).rsplit(".", 1)[-1]
            raise QueryRefusedError(
                f"only read queries (SELECT) are allowed, not {kind}: the history is append-only and "
                "changed only by the daemon"
            )
    if len(statements) > 1:
        raise QueryRefusedError("one statement per query, please")


def run_query(con: duckdb.DuckDBPyConnection, sql: str, limit: int, timeout: float) -> QueryResult:
    """Check and run ``sql`` on ``con`` (its own cursor); at most ``limit`` rows.

    Raises:
        QueryRefusedError: not a read-only query, or it tried to reach files or the network.
        QueryError: the query failed or ran longer than ``timeout`` seconds.
    """
    check_read_only(con, sql)
    timer = threading.Timer(timeout, con.interrupt)
    timer.start()
    try:
        cursor = con.execute(sql)
        rows = cursor.fetchmany(limit + 1)
        description = cursor.description or []
    except duckdb.PermissionException as exc:
        raise QueryRefusedError(f"file and network access from SQL is disabled: {exc}") from None
    except duckdb.InterruptException:
        raise QueryError(f"query interrupted after {timeout:g} s (query_timeout_s)") from None
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from None
    finally:
        timer.cancel()
    return QueryResult(
        columns=[d[0] for d in description],
        types=[str(d[1]) for d in description],
        rows=[[_plain(v) for v in row] for row in rows[:limit]],
        truncated=len(rows) > limit,
    )


def answer(con: duckdb.DuckDBPyConnection, request: QueryRequest, max_limit: int, timeout: float) -> QueryResult:
    """``run_query`` with errors folded into the result, for the request/reply responder."""
    limit = min(request.limit or max_limit, max_limit)
    try:
        return run_query(con, request.sql, limit, timeout)
    except QueryRefusedError as exc:
        return QueryResult(error=str(exc), refused=True)
    except QueryError as exc:
        return QueryResult(error=str(exc))


def open_read_only(path: str) -> duckdb.DuckDBPyConnection:
    """The database file opened read-only, for when no daemon is running."""
    return duckdb.connect(path, read_only=True, config=READ_ONLY_CONFIG)
