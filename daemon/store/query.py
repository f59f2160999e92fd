"""Read-only SQL over the store: checking, running within budgets, and the wire format of answers.

Three locks keep queries read-only:

1. DuckDB's own parser must see one ``SELECT`` (``extract_statements``), and its parse tree
   (``json_serialize_sql``) must hold only SELECT-shaped query nodes and none of the functions that
   change state: no ``DELETE``/``INSERT``/``UPDATE``/``COPY`` hidden in a ``WITH`` clause or a
   subquery, no ``nextval``, no ``checkpoint()``. The statement that runs is the one parsed here.
2. It runs inside a transaction that is always rolled back, so a write that got past 1 is undone.
3. The database is opened with ``enable_external_access = false`` and a locked configuration, so
   even a ``SELECT`` cannot read files or URLs (``read_csv('/etc/passwd')``, ``'https://...'``).

Queries run in the daemon's process, on their own connection: the writer holds the file's lock,
so no other process can open it. Budgets keep one query from starving or killing the daemon:
the answer's rows and bytes are counted while Arrow record batches stream out of DuckDB (a row
becomes Python objects only once its Arrow size fits what is left), and a guard thread interrupts
the query past its timeout, when the process grew by ``memory_bytes``, or when DuckDB's temp
directory grew by ``spill_bytes`` (DuckDB's own ``max_temp_directory_size`` is not enforced by the
2.0 build we ship with, and its ``memory_limit`` cannot see a vector's strings). DuckDB sees an interrupt
only between vectors of 2 048 rows, so a call that makes huge values in one vector (``repeat('x', 1e9)``)
is refused before it runs (:mod:`._value_sizes`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from decimal import Decimal
from typing import Any, Literal, NamedTuple

import duckdb
import msgspec
import pyarrow as pa

from trainvigil.daemon.sandbox import READ_ONLY_CONFIG
from trainvigil.daemon.store._value_sizes import size_refusal
from trainvigil.errors import QueryError, QueryRefusedError, VigilError
from trainvigil.schemas.query import MAX_SQL_CHARS, QueryRequest, QueryResult, validate
from trainvigil.schemas.sqltypes import is_known, quote_identifier

DEFAULT_MAX_BYTES = 16 * 2**20
DEFAULT_MEMORY_BYTES = 512 * 2**20
DEFAULT_SPILL_BYTES = 256 * 2**20
_BATCH_ROWS = 64  # rows per Arrow batch: the most converted to Python before the budget is checked again
_POLL_S = 0.01

_QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
"""Parse-tree query nodes that only read; any other ``*_NODE`` (``DELETE_QUERY_NODE``...) is refused."""
_STATEFUL_FUNCTIONS = frozenset(
    {
        "nextval",
        "setval",
        "setseed",
        "write_log",
        "checkpoint",
        "force_checkpoint",
        "query",  # runs SQL text the parse tree cannot see into
        "json_execute_serialized_sql",
        "enable_logging",
        "disable_logging",
        "truncate_duckdb_logs",
        "enable_profiling",
        "disable_profiling",
        "create_external_resource",
        "register_external_resource",
        "register_external_resource_type",
        "deregister_external_resource",
        "destroy_external_resource",
        "arrow_scan",  # the arrow/pandas scans take raw pointers
        "arrow_scan_dumb",
        "python_arrow_scan",
        "pandas_scan",
        "python_map_function",
    }
)
"""Functions that change state (a sequence, the checkpoint, logging) or reach outside SQL."""
_NATIVE_TYPES = frozenset(
    {
        "boolean",
        "tinyint",
        "smallint",
        "integer",
        "bigint",
        "hugeint",
        "utinyint",
        "usmallint",
        "uinteger",
        "ubigint",
        "float",
        "double",
        "varchar",
        "blob",
    }
)
"""Column types whose Arrow values msgpack carries as they are; other columns travel as DuckDB's text."""

_encoder = msgspec.msgpack.Encoder()


def _plain(value: Any) -> Any:
    """A value msgpack can carry: HUGEINTs become ints where msgpack holds them, anything else strings."""
    if value is None or isinstance(value, bool | float | str | bytes):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else str(value)
    if isinstance(value, Decimal):  # only HUGEINT arrives as a Decimal: DECIMAL columns travel as text
        return _plain(int(value)) if value.as_tuple().exponent == 0 else str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


# ---- checking ------------------------------------------------------------------------------------


def _refused_kind(kind: str) -> QueryRefusedError:
    return QueryRefusedError(
        f"only read queries (SELECT) are allowed, not {kind}: the history is append-only and changed only by the daemon"
    )


def _tree_refusal(tree: Any) -> QueryRefusedError | None:
    """Why a statement's JSON parse tree is not read-only, or ``None``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            kind = node.get("type")
            if isinstance(kind, str) and kind.endswith("_NODE") and kind not in _QUERY_NODES:
                return _refused_kind(f"{kind.removesuffix('_NODE').removesuffix('_QUERY')} (inside the query)")
            name = node.get("function_name")
            if isinstance(name, str) and name.lower() in _STATEFUL_FUNCTIONS:
                return QueryRefusedError(f"{name}() is not allowed in a read query: it changes state or runs other SQL")
            stack.extend(node.values())
    return None


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> duckdb.Statement:
    """The one read-only statement in ``sql``, as DuckDB parsed it (run that, not the text).

    Raises:
        QueryRefusedError: the text is empty or too long, does not parse, holds more than one
            statement, or a statement that is not a ``SELECT``, or a ``SELECT`` whose parse tree
            holds a write (``WITH x AS (DELETE ... RETURNING *)``) or a function that changes state.
    """
    if not sql.strip():
        raise QueryRefusedError('empty query; try: vigil sql "select * from runs"')
    if len(sql) > MAX_SQL_CHARS:
        raise QueryRefusedError(f"the query is {len(sql)} characters long; at most {MAX_SQL_CHARS} are accepted")
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefusedError(f"could not parse the query: {exc}") from None
    if not statements:
        raise QueryRefusedError("no statement in the query")
    for statement in statements:
        if statement.type != duckdb.StatementType.SELECT:
            raise _refused_kind(str(statement.type).rsplit(".", 1)[-1])
    if len(statements) > 1:
        raise QueryRefusedError("one statement per query, please")
    refusal = _tree_refusal(_parse_tree(con, statements[0]))
    if refusal is not None:
        raise refusal
    return statements[0]


def _parse_tree(con: duckdb.DuckDBPyConnection, statement: duckdb.Statement) -> Any:
    """DuckDB's JSON parse tree of ``statement`` (a ``SELECT``)."""
    try:
        row = con.execute("SELECT json_serialize_sql(?::VARCHAR)", [statement.query]).fetchone()
        tree = msgspec.json.decode(row[0] if row else "{}")
    except (duckdb.Error, msgspec.DecodeError) as exc:
        raise QueryRefusedError(f"could not check the query: {exc}") from None
    if tree.get("error") or len(tree.get("statements", [])) != 1:
        raise QueryRefusedError(f"only a single read query (SELECT) is allowed: {tree.get('error_message', '')}")
    return tree


# ---- running -------------------------------------------------------------------------------------


def _rss() -> int | None:
    """This process's resident memory in bytes (Linux), else ``None``."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _dir_bytes(path: str) -> int:
    try:
        with os.scandir(path) as entries:
            return sum(e.stat(follow_symlinks=False).st_size for e in entries if e.is_file(follow_symlinks=False))
    except OSError:
        return 0


class _Guard:
    """A thread that interrupts the query on ``con`` past its deadline, memory or spill budget.

    Memory is the whole process's growth since the query started (DuckDB's ``memory_limit`` is one
    for the database and blind to vectors' strings), so ingest growing meanwhile counts too: the
    query is what gives way. ``reason`` says why it interrupted, empty if it did not.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, timeout: float, memory_bytes: int, spill_bytes: int) -> None:
        self._con = con
        self._timeout = timeout
        self._memory_bytes = memory_bytes
        self._spill_bytes = spill_bytes
        row = con.execute("SELECT current_setting('temp_directory')").fetchone()
        self._temp_dir = str(row[0]) if row and row[0] else ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="vigil-query-guard", daemon=True)
        self.reason = ""

    def __enter__(self) -> _Guard:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        deadline = time.monotonic() + self._timeout
        rss_start = _rss()
        spill_start = _dir_bytes(self._temp_dir) if self._temp_dir else 0
        while not self._stop.wait(_POLL_S):
            if self.reason:
                # Again at every poll until the query ends: DuckDB forgets an interrupt that comes before it
                # starts executing (binding, the cast to text, the reader's first fetch).
                self._con.interrupt()
                continue
            rss = _rss()
            spilled = _dir_bytes(self._temp_dir) - spill_start if self._temp_dir else 0
            if time.monotonic() >= deadline:
                self.reason = f"query interrupted after {self._timeout:g} s (query_timeout_s)"
            elif rss is not None and rss_start is not None and rss - rss_start > self._memory_bytes:
                self.reason = (
                    f"query interrupted: the daemon grew by {(rss - rss_start) >> 20} MiB while it ran "
                    f"(query_memory_bytes = {self._memory_bytes >> 20} MiB); select fewer or narrower rows, "
                    "aggregate first, or add LIMIT"
                )
            elif spilled > self._spill_bytes:
                self.reason = (
                    f"query interrupted: it spilled {spilled >> 20} MiB to disk "
                    f"(query_spill_bytes = {self._spill_bytes >> 20} MiB); narrow the joins or add filters"
                )
            else:
                continue
            self._con.interrupt()

    def failure(self, exc: BaseException) -> VigilError:
        """The error to raise for ``exc``, raised while the query ran."""
        if self.reason:
            return QueryError(self.reason)
        text = str(exc)
        if isinstance(exc, duckdb.PermissionException) or text.startswith("Permission Error"):
            return QueryRefusedError(f"file and network access from SQL is disabled: {text}")
        if isinstance(exc, duckdb.OutOfMemoryException):
            return QueryError(
                f"the query needs more memory than the daemon's DuckDB may use (store.memory_limit_bytes; "
                f"the query_memory_bytes guard stops it sooner otherwise); select fewer or narrower rows, "
                f"or aggregate in SQL: {text}"
            )
        return QueryError(text)


def _native(t: Any) -> bool:
    if t.id in _NATIVE_TYPES:
        return True
    if t.id in ("list", "struct", "map"):
        return all(_native(child) for _, child in t.children)
    return bool(t.id == "array" and _native(t.children[0][1]))


def _wire_types(relation: duckdb.DuckDBPyRelation) -> list[str]:
    """The column types an answer names: DuckDB's, or ``VARCHAR`` for one a client would not accept
    (:func:`~trainvigil.schemas.sqltypes.parse_type`: ``ENUM``, ``VARIANT``...), which travels as text."""
    return [name if is_known(name := str(t)) else "VARCHAR" for t in relation.types]


def _wire_columns(relation: duckdb.DuckDBPyRelation, types: list[str]) -> duckdb.DuckDBPyRelation:
    """``relation`` with every column msgpack cannot carry as it is (times, decimals, intervals), or
    whose type the answer names ``VARCHAR`` instead (``types``), cast to text.

    DuckDB writes the text, so no Python time-zone database is needed (TIMESTAMPTZ) and nothing
    is lost (TIMESTAMP_NS). Columns are named by position: a result may repeat a name.
    """
    kept = [_native(t) and named == str(t) for t, named in zip(relation.types, types, strict=True)]
    if all(kept):
        return relation
    exprs = []
    for i, (name, keep) in enumerate(zip(relation.columns, kept, strict=True), start=1):
        alias = quote_identifier(name)
        exprs.append(f"#{i} AS {alias}" if keep else f"CAST(#{i} AS VARCHAR) AS {alias}")
    return relation.project(", ".join(exprs))


class _Cut(NamedTuple):
    """Which budget cut an answer (``rows``, ``bytes``, or empty: none did) and the note saying so."""

    by: Literal["", "rows", "bytes"]
    note: str


def _rows_that_fit(batch: pa.RecordBatch, room: int) -> int:
    """How many leading rows of ``batch`` hold at most ``room`` bytes of Arrow data."""
    total = 0
    for i in range(batch.num_rows):
        total += batch.slice(i, 1).nbytes
        if total > room:
            return i
    return batch.num_rows


def _collect(reader: pa.RecordBatchReader, limit: int, max_bytes: int) -> tuple[list[list[Any]], _Cut]:
    """Rows from ``reader`` until it ends or a budget is reached, and which budget cut them, if one did."""
    rows: list[list[Any]] = []
    used = 0

    def by_bytes() -> _Cut:
        note = (
            f"truncated at {used} bytes ({len(rows)} rows): the next row would pass the answer's budget of "
            f"{max_bytes} bytes (query_max_bytes); select fewer or narrower columns, or add LIMIT"
        )
        return _Cut("bytes", note)

    for batch in reader:
        room = limit - len(rows)
        cut = batch.num_rows > room
        if cut:
            batch = batch.slice(0, room)
        fits = batch.num_rows if batch.nbytes <= max_bytes - used else _rows_that_fit(batch, max_bytes - used)
        columns = [column.to_pylist(maps_as_pydicts="lossy") for column in batch.slice(0, fits).columns]
        for values in zip(*columns, strict=True):
            row = [_plain(v) for v in values]
            size = len(_encoder.encode(row))
            if used + size > max_bytes:
                return rows, by_bytes()
            rows.append(row)
            used += size
        if fits < batch.num_rows:
            return rows, by_bytes()
        if cut:
            return rows, _Cut("rows", f"truncated at {limit} rows (the row limit); add LIMIT or raise --limit")
    return rows, _Cut("", "")


def run_query(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    limit: int,
    timeout: float,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    spill_bytes: int = DEFAULT_SPILL_BYTES,
) -> QueryResult:
    """Check and run ``sql`` on ``con`` (its own connection) in a transaction that is rolled back.

    Args:
        limit: rows the answer holds at most; ``max_bytes``: its encoded rows' size at most.
        timeout: seconds before the query is interrupted.
        memory_bytes, spill_bytes: growth of this process and of DuckDB's temp directory at
            which the query is interrupted; a call whose values could pass ``memory_bytes`` within
            one vector of rows is refused before the query runs.

    Raises:
        QueryRefusedError: not a read-only query, it tried to reach files or the network, a call
            would make values too big (or of a size not written in the query), or a budget is below 1.
        QueryError: the query failed, ran past ``timeout`` or past a memory or spill budget.
    """
    if min(limit, max_bytes, memory_bytes, spill_bytes) < 1 or not timeout > 0:
        raise QueryRefusedError(
            f"limit ({limit}), max_bytes ({max_bytes}), memory_bytes and spill_bytes must be at least 1, "
            f"timeout ({timeout}) above 0"
        )
    statement = check_read_only(con, sql)
    # Parsed again (a millisecond) rather than passed along: the read-only check stays one function.
    if (refusal := size_refusal(_parse_tree(con, statement), memory_bytes)) is not None:
        raise refusal
    guard = _Guard(con, timeout, memory_bytes, spill_bytes)
    con.execute("BEGIN TRANSACTION")
    try:
        with guard:
            reader: pa.RecordBatchReader | None = None
            try:
                relation = con.sql(statement)
                columns, types = relation.columns, _wire_types(relation)
                reader = _wire_columns(relation, types).to_arrow_reader(_BATCH_ROWS)
                rows, cut = _collect(reader, limit, max_bytes)
            except (duckdb.Error, OSError, pa.ArrowException) as exc:
                raise guard.failure(exc) from None
            finally:
                if reader is not None:
                    with contextlib.suppress(duckdb.Error, OSError, pa.ArrowException):
                        reader.close()
    finally:
        # Always: whatever the statement did is undone. After an interrupt DuckDB may have ended it already.
        with contextlib.suppress(duckdb.TransactionException):
            con.execute("ROLLBACK")
    return QueryResult(
        columns=columns, types=types, rows=rows, truncated=bool(cut.by), truncated_by=cut.by, note=cut.note
    )


def answer(
    con: duckdb.DuckDBPyConnection,
    request: QueryRequest,
    max_limit: int,
    timeout: float,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    spill_bytes: int = DEFAULT_SPILL_BYTES,
) -> QueryResult:
    """``run_query`` with the request's budgets lowered to the daemon's and errors folded into the result."""
    try:
        request = validate(request)
        return run_query(
            con,
            request.sql,
            min(request.limit or max_limit, max_limit),
            min(request.timeout_s or timeout, timeout),
            max_bytes=min(request.max_bytes or max_bytes, max_bytes),
            memory_bytes=memory_bytes,
            spill_bytes=spill_bytes,
        )
    except QueryRefusedError as exc:
        return QueryResult(error=str(exc), refused=True)
    except QueryError as exc:
        return QueryResult(error=str(exc))


def open_read_only(path: str) -> duckdb.DuckDBPyConnection:
    """The database file opened read-only, for when no daemon is running."""
    return duckdb.connect(path, read_only=True, config=READ_ONLY_CONFIG)
