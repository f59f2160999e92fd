"""``vigil export``: every row of one run's table, past any query budget, as CSV or Parquet.

The rows come through the ordinary read-only query path (the daemon over NATS, or the file when
no daemon runs), a page at a time with keyset pagination: each page asks for the rows after the
last key it received (``(rank, step)`` for steps), ``ORDER BY key LIMIT page + 1``. So neither side
holds more than a page, every page is a cheap top-N for DuckDB, and a page that the daemon's row
limit or byte budget cuts short is simply continued from its last row. Rows committed before the
export started are all in it; rows committed while it runs may be.
"""

from __future__ import annotations

import csv
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NamedTuple, Protocol

from trainvigil.errors import EXIT_QUERY, EXIT_USAGE, ConfigError, QueryError, VigilError
from trainvigil.schemas.query import QueryResult
from trainvigil.schemas.sqltypes import ColumnTypeError, render

_KEY_PREFIX = "__vigil_key"


class UnknownRunError(VigilError, LookupError):
    """The run to export is not in the history."""

    exit_code = EXIT_USAGE


class ExportWriteError(VigilError, OSError):
    """The export could not be written; the output file (``-o``) is left as it was."""

    exit_code = EXIT_QUERY


class Table(NamedTuple):
    """A table with one row set per run, and the key that orders its rows uniquely and stably."""

    name: str
    key: tuple[str, ...]


# Steps are merged (deleted and inserted again) by (run_id, rank, step), so that is their key. The
# other tables only grow, so DuckDB's rowid is stable for them; an anomaly is replaced as its episode
# escalates and clears, so the episode is its key.
TABLES = {
    t.name: t
    for t in [
        Table("steps", ("rank", "step")),
        Table("events", ("rowid",)),
        Table("heartbeats", ("rowid",)),
        Table("gil_samples", ("rowid",)),
        Table("checkpoints", ("rowid",)),
        Table("anomalies", ("episode",)),
    ]
}


class Ask(Protocol):
    def __call__(self, sql: str, limit: int) -> QueryResult: ...


# ---- SQL (pure) --------------------------------------------------------------------------------------


def literal(value: Any) -> str:
    """``value`` as a SQL literal (keys and run ids are ints or strings)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {value!r}")


def _after(key: Sequence[str], last: Sequence[Any]) -> str:
    """Rows whose ``key`` sorts after ``last``: ``a > x OR (a = x AND b > y)``."""
    terms = []
    for i, column in enumerate(key):
        equal = [f"{k} = {literal(v)}" for k, v in zip(key[:i], last[:i], strict=True)]
        terms.append("(" + " AND ".join([*equal, f"{column} > {literal(last[i])}"]) + ")")
    return " OR ".join(terms)


def page_sql(table: Table, run_id: str, last: Sequence[Any] | None, rows: int) -> str:
    """The query for the next page: up to ``rows + 1`` rows after key ``last`` (``None``: from the start).

    The key travels at the end of each row as extra columns (``rowid`` is not among ``*``); one row past
    the page lets an answer cut at ``rows`` rows say ``truncated``, which is how a page says more follow.
    """
    keys = ", ".join(f"{k} AS {_KEY_PREFIX}{i}" for i, k in enumerate(table.key))
    where = f"run_id = {literal(run_id)}" + ("" if last is None else f" AND ({_after(table.key, last)})")
    order = ", ".join(table.key)
    return f"SELECT *, {keys} FROM {table.name} WHERE {where} ORDER BY {order} LIMIT {rows + 1}"


def count_sql(table: Table, run_id: str) -> str:
    """Whether the run is known (``runs``), and how many rows of ``table`` it has."""
    run = literal(run_id)
    return (
        f"SELECT (SELECT count(*) FROM runs WHERE run_id = {run}) AS known, "
        f"(SELECT count(*) FROM {table.name} WHERE run_id = {run}) AS rows"
    )


# ---- paging --------------------------------------------------------------------------------------


def count_rows(ask: Ask, table: Table, run_id: str) -> int:
    """Rows of ``table`` the run has now.

    Raises:
        UnknownRunError: the history holds nothing of ``run_id``.
    """
    known, rows = ask(count_sql(table, run_id), 1).rows[0]
    if not known and not rows:
        raise UnknownRunError(f"run {run_id!r} is not in the history; list the runs with `vigil runs`")
    return int(rows)


def pages(ask: Ask, table: Table, run_id: str, page_rows: int) -> Iterator[QueryResult]:
    """Every row of ``run_id`` in ``table``, a page at a time in key order, without the key columns.

    The first page always comes, even empty (it carries the columns).

    Raises:
        QueryError: a page failed, or one row is larger than the daemon's byte budget.
    """
    last: list[Any] | None = None
    width = len(table.key)
    while True:
        result = ask(page_sql(table, run_id, last, page_rows), page_rows)
        yield QueryResult(
            columns=result.columns[:-width], types=result.types[:-width], rows=[r[:-width] for r in result.rows]
        )
        if not result.truncated:
            return
        if not result.rows:
            raise QueryError(
                f"one row of {table.name} after key {last} is larger than the answer's byte budget "
                f"(query_max_bytes); raise it in the daemon's configuration: {result.note}"
            )
        last = result.rows[-1][-width:]


# ---- writing -------------------------------------------------------------------------------------


class _Csv:
    """Pages as CSV, as ``vigil sql --format csv`` prints them: header once, then rows."""

    def __init__(self, out: IO[Any]) -> None:
        self._writer = csv.writer(out)
        self._header = False

    def write(self, page: QueryResult) -> None:
        if not self._header:
            self._writer.writerow(page.columns)
            self._header = True
        self._writer.writerows(page.rows)

    def close(self) -> None:
        pass


class _Parquet:
    """Pages as one Parquet file with DuckDB's own types (times arrive as text and are parsed back)."""

    def __init__(self, out: IO[Any]) -> None:
        self._out = out
        self._writer: Any = None
        self._schema: Any = None

    def write(self, page: QueryResult) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._writer is None:
            self._schema = _arrow_schema(page)
            self._writer = pq.ParquetWriter(self._out, self._schema)
        columns = [_arrow_column([r[i] for r in page.rows], f.type) for i, f in enumerate(self._schema)]
        self._writer.write_table(pa.Table.from_arrays(columns, schema=self._schema))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _arrow_schema(page: QueryResult) -> Any:
    """The Arrow schema DuckDB gives the page's column types (parsed: the answer's text is never SQL).

    Raises:
        ColumnTypeError: a column type is not one a daemon sends.
    """
    import pyarrow as pa

    from trainvigil.daemon.sandbox import sandboxed

    try:
        types = page.column_types()
    except ColumnTypeError as exc:
        raise ColumnTypeError(
            f"the answer to export: {exc}; nothing it sent was run. If what answers on this broker is no vigil "
            "daemon of this version, find it, and secure the bus with `vigil up --auth`"
        ) from None
    con = sandboxed()
    try:
        nulls = ", ".join(f"NULL::{render(t)} AS c{i}" for i, t in enumerate(types))
        schema = con.sql(f"SELECT {nulls}").to_arrow_table().schema
    finally:
        con.close()
    # Types with no text form Arrow can parse (intervals) stay text, as the answer carries them.
    fields = [
        pa.field(name, pa.string() if pa.types.is_interval(f.type) or pa.types.is_duration(f.type) else f.type)
        for name, f in zip(page.columns, schema, strict=True)
    ]
    return pa.schema(fields)


def _arrow_column(values: list[Any], kind: Any) -> Any:
    import pyarrow as pa

    t = pa.types
    if t.is_timestamp(kind) or t.is_date(kind) or t.is_time(kind) or t.is_decimal(kind):
        return pa.array(values, pa.string()).cast(kind)  # these travel as DuckDB's text
    return pa.array(values, kind)


WRITERS: dict[str, Callable[[IO[Any]], _Csv | _Parquet]] = {"csv": _Csv, "parquet": _Parquet}


def target(output: str | None, fmt: str) -> Path | None:
    """The file ``-o`` names (``None``: stdout), checked before anything is read.

    Raises:
        ConfigError: parquet without a file, or the file's directory does not exist.
    """
    if output is None and fmt == "parquet":
        raise ConfigError("parquet needs a file: pass -o FILE (only csv goes to stdout)", key="output")
    path = None if output is None else Path(output)
    if path is not None and not path.parent.is_dir():
        raise ConfigError(f"-o {path}: the directory {path.parent} does not exist", key="output")
    return path


@contextmanager
def output(path: Path | None, binary: bool) -> Iterator[IO[Any]]:
    """Where the export goes: stdout, or ``path`` written atomically (a temp file beside it, renamed).

    ``path`` is replaced only once everything was written and synced; on any failure it is left as it
    was and the temp file removed.

    Raises:
        ExportWriteError: the file could not be written.
    """
    if path is None:
        yield sys.stdout.buffer if binary else sys.stdout
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise ExportWriteError(f"cannot write in {path.parent}: {exc.strerror or exc}") from None
    try:
        with open(fd, "wb" if binary else "w", newline=None if binary else "") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise ExportWriteError(f"cannot write {path} ({exc.strerror or exc}); it was left as it was") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


class Progress:
    """Progress of a long export on stderr: a line at most every ``interval`` seconds, none for a quick one."""

    def __init__(self, what: str, total: int, interval: float = 2.0, stream: IO[str] | None = None) -> None:
        self._what = what
        self._total = total
        self._interval = interval
        self._stream = stream or sys.stderr
        self._next = time.monotonic() + interval

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._interval
        share = f" ({100 * done // self._total}%)" if self._total else ""
        print(f"vigil: {self._what}: {done} of {self._total} rows{share}", file=self._stream, flush=True)


def export_rows(
    ask: Ask, table: Table, run_id: str, fmt: str, out: IO[Any], *, page_rows: int, progress: Callable[[int], None]
) -> int:
    """Write every row of ``run_id`` in ``table`` to ``out`` as ``fmt`` (``csv`` or ``parquet``); returns the rows.

    Args:
        ask: runs one read-only query (a :class:`~trainvigil.daemon.cli.sqlclient.QuerySource`'s ``ask``).
        page_rows: rows asked for per page (the daemon may cut a page shorter; the next continues it).
        progress: called with the rows written so far after each page.
    """
    writer = WRITERS[fmt](out)
    done = 0
    try:
        for page in pages(ask, table, run_id, page_rows):
            writer.write(page)
            done += len(page.rows)
            progress(done)
    finally:
        writer.close()
    return done
