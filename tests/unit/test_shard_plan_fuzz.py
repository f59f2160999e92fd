"""The cross-shard planner, fuzzed: random queries over rows split over 2-4 shards answer what one DuckDB answers.

The rows are split as the broker splits them (:func:`trainvigil.schemas.shards.shard_of` of the run id), every
shard answers its part with the daemon's own :func:`~trainvigil.daemon.store.query.run_query`, and the CLI's
:func:`~trainvigil.daemon.cli.shardsql.merge` combines the answers: the result must equal one DuckDB's answer
over all the rows (columns, types, rows; in order under ORDER BY), or the planner refuses the query with
:class:`~trainvigil.errors.QueryRefusedError`. Queries come from a grammar of what people write: projections,
WHERE, DISTINCT, ORDER BY (expressions, positions, NULLS), LIMIT/OFFSET, aggregates with GROUP BY (expressions,
positions, aliases, ALL), HAVING, FILTER, joins on the run, CTEs, subqueries per run and windows in FROM.

Subqueries that aggregate a whole table inside the pushed-down part are left out: they see one shard's rows by
design (docs/operations/cluster.md says so); the grammar's subqueries are per run, which each shard answers whole.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainvigil.daemon.cli.shardsql import Gathered, merge
from trainvigil.daemon.shards import plan
from trainvigil.daemon.store.query import run_query
from trainvigil.errors import QueryRefusedError
from trainvigil.schemas.query import QueryResult
from trainvigil.schemas.shards import shard_of

settings.register_profile(
    "shard-plan-fuzz", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
FUZZ = settings.get_profile("shard-plan-fuzz")
"""About 100 ms an example (the plan and the merge each open a DuckDB; every shard answers): a
few seconds a run; longer runs (``max_examples=2000``) found the bugs pinned at the end of this file."""

LIMIT, TIMEOUT = 10_000, 30.0
"""The row limit and deadline of every answer (the daemon's defaults; no answer here comes near them)."""

TABLES = {
    "runs": "run_id VARCHAR, status VARCHAR, world_size INTEGER",
    "steps": "run_id VARCHAR NOT NULL, rank INTEGER NOT NULL, step BIGINT NOT NULL, loss DOUBLE, grad_norm DOUBLE",
    "anomalies": "run_id VARCHAR, rank INTEGER, step BIGINT, detector VARCHAR, severity VARCHAR, value DOUBLE",
}
"""Columns of the history's tables (store/schema.sql), as many as the queries use."""

RUN_IDS = [f"run-{c}" for c in "abcdefgh"]
DETECTORS = ["loss_spike", "grad_explosion", "straggler"]

# Values are multiples of 1/8: their sums are exact in any order, so only avg and friends need a tolerance.
_halves = st.one_of(st.none(), st.integers(-12, 12).map(lambda k: k / 8))


@dataclass(frozen=True)
class History:
    """Rows of every table, and how many shards they are split over."""

    shards: int
    rows: dict[str, list[tuple[Any, ...]]]


@st.composite
def histories(draw: st.DrawFn) -> History:
    run_ids = draw(st.lists(st.sampled_from(RUN_IDS), min_size=1, max_size=6, unique=True))  # empty: pinned below
    rows: dict[str, list[tuple[Any, ...]]] = {"runs": [], "steps": [], "anomalies": []}
    for run_id in run_ids:
        status = draw(st.sampled_from(["running", "done", "failed", None]))
        ranks = draw(st.integers(1, 3))
        rows["runs"].append((run_id, status, ranks))
        for rank in range(ranks):
            for step in draw(st.lists(st.integers(0, 9), max_size=5, unique=True)):
                rows["steps"].append((run_id, rank, step, draw(_halves), draw(_halves)))
        for detector in draw(st.lists(st.sampled_from(DETECTORS), max_size=3, unique=True)):
            rank, step = draw(st.integers(0, ranks - 1)), draw(st.integers(0, 9))
            severity = draw(st.sampled_from(["warn", "crit"]))
            rows["anomalies"].append((run_id, rank, step, detector, severity, draw(_halves)))
    return History(draw(st.integers(2, 4)), rows)


_DATABASES: dict[int, list[duckdb.DuckDBPyConnection]] = {}
"""In-memory databases kept between examples (opening one costs more than the rest of an example): the first
is the whole history's, the others the shards'; keyed by the shard count."""


def _load(con: duckdb.DuckDBPyConnection, rows: dict[str, list[tuple[Any, ...]]]) -> duckdb.DuckDBPyConnection:
    for table, columns in TABLES.items():
        con.execute(f"CREATE OR REPLACE TABLE {table} ({columns})")
        if rows[table]:  # one statement: executemany inserts row by row
            marks = ", ".join([f"({', '.join('?' * len(rows[table][0]))})"] * len(rows[table]))
            con.execute(f"INSERT INTO {table} VALUES {marks}", [v for row in rows[table] for v in row])
    return con


def split(history: History) -> tuple[list[duckdb.DuckDBPyConnection], duckdb.DuckDBPyConnection]:
    """Each shard's database (its runs' rows, by the broker's partitioning) and one database of every row."""
    parts: list[dict[str, list[tuple[Any, ...]]]] = [{t: [] for t in TABLES} for _ in range(history.shards)]
    for table, rows in history.rows.items():
        for row in rows:
            parts[shard_of(row[0], history.shards)][table].append(row)
    cons = _DATABASES.setdefault(history.shards, [duckdb.connect() for _ in range(history.shards + 1)])
    return [_load(con, p) for con, p in zip(cons[1:], parts, strict=True)], _load(cons[0], history.rows)


# ---- the grammar ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """What a query reads: FROM text, its columns by kind, and a set of columns unique per row."""

    sql: str
    keys: tuple[str, ...]
    numbers: tuple[str, ...]
    texts: tuple[str, ...]
    unique: tuple[str, ...]
    where: tuple[str, ...]


_STEPS_WHERE = (
    "loss > 0",
    "loss IS NULL",
    "grad_norm <= loss",
    "rank = 1",
    "step % 2 = 0",
    "step BETWEEN 2 AND 6",
    "run_id IN (SELECT run_id FROM runs WHERE status = 'done')",
    "EXISTS (SELECT 1 FROM anomalies a WHERE a.run_id = steps.run_id AND a.step <= steps.step)",
    "step = (SELECT max(s.step) FROM steps s WHERE s.run_id = steps.run_id AND s.rank = steps.rank)",
    "run_id LIKE 'run-%' AND coalesce(loss, 0) < 1",
)
STEPS = Source(
    "steps", ("run_id", "rank", "step"), ("loss", "grad_norm", "step"), ("run_id",), ("run_id", "rank", "step"),
    _STEPS_WHERE,
)  # fmt: skip
SOURCES = (
    STEPS,
    Source(
        "anomalies", ("run_id", "detector", "severity", "rank"), ("value", "step"), ("detector", "severity"),
        ("run_id", "detector"), ("severity = 'crit'", "value > 0 OR value IS NULL", "detector <> 'straggler'"),
    ),
    Source(
        "steps JOIN runs USING (run_id)", ("run_id", "status", "rank", "world_size"), ("loss", "step", "world_size"),
        ("status",), ("run_id", "rank", "step"), ("status = 'running'", "rank < world_size - 1", "loss >= 0"),
    ),
    Source(
        "(SELECT run_id, rank, step, loss, loss - lag(loss) OVER (PARTITION BY run_id, rank ORDER BY step) AS delta,"
        " row_number() OVER (PARTITION BY run_id ORDER BY step DESC, rank) AS recent FROM steps) AS w",
        ("run_id", "rank", "recent"), ("delta", "loss", "recent"), ("run_id",), ("run_id", "rank", "step"),
        ("recent <= 3", "delta IS NOT NULL", "delta > 0"),
    ),
    Source(
        "(SELECT s.run_id, s.step, s.loss, count(a.detector) AS flagged FROM steps s LEFT JOIN anomalies a ON "
        "a.run_id = s.run_id AND a.step = s.step GROUP BY ALL) AS f",
        ("run_id", "flagged"), ("loss", "flagged", "step"), ("run_id",), ("run_id", "step", "loss", "flagged"),
        ("flagged > 0", "loss IS NOT NULL"),
    ),
)  # fmt: skip
"""Each source's subqueries work per run (windows partitioned by run_id, joins on the run)."""


@dataclass(frozen=True)
class Query:
    """A query, the same without its LIMIT (to check an unordered LIMIT took rows of the answer), and what it may do."""

    sql: str
    unlimited: str
    ordered: bool
    may_refuse: bool = False


def _where(draw: st.DrawFn, source: Source) -> str:
    conditions = draw(st.lists(st.sampled_from(source.where), max_size=2, unique=True))
    return f" WHERE {' AND '.join(conditions)}" if conditions else ""


def _direction(draw: st.DrawFn) -> str:
    return draw(st.sampled_from(["", " DESC", " ASC NULLS FIRST", " DESC NULLS LAST"]))


def _limit(draw: st.DrawFn) -> str:
    limit = draw(st.one_of(st.none(), st.integers(0, 12)))
    if limit is None:
        return ""
    offset = draw(st.one_of(st.none(), st.integers(0, 5)))
    return f" LIMIT {limit}" + ("" if offset is None else f" OFFSET {offset}")


def _with_cte(draw: st.DrawFn, source: Source) -> tuple[str, Source]:
    """Sometimes the source as a CTE of its filtered rows (per row, so each shard's part is exact)."""
    if not draw(st.booleans()) or source is not STEPS:
        return "", source
    cte = f"WITH s AS (SELECT * FROM steps{_where(draw, source)}) "
    return cte, Source("s", source.keys, source.numbers, source.texts, source.unique, source.where[:6])


@st.composite
def row_queries(draw: st.DrawFn) -> Query:
    cte, source = _with_cte(draw, draw(st.sampled_from(SOURCES)))
    columns = [*dict.fromkeys([*source.keys, *source.numbers, *source.texts])]
    exprs = [
        *columns,
        f"{source.numbers[0]} * 2 AS doubled",
        f"coalesce({source.numbers[0]}, -1) AS filled",
        f"upper({source.texts[0]}) AS shout",
        f"{source.numbers[-1]} + 1",
    ]
    items = draw(st.lists(st.sampled_from(exprs), min_size=1, max_size=4, unique=True))
    distinct = draw(st.booleans()) and draw(st.booleans())
    head = f"{cte}SELECT {'DISTINCT ' if distinct else ''}{', '.join(items)} FROM {source.sql}{_where(draw, source)}"
    order = draw(st.sampled_from(["none", "total", "positions"]))
    may_refuse = False
    if order == "none":
        limit = _limit(draw) if not distinct else ""
        return Query(head + limit, head, ordered=False)
    if distinct or order == "positions":
        # DISTINCT rows are ordered by output positions only; all of them make the order total.
        positions = list(range(1, len(items) + 1))
        ordered = draw(st.permutations(positions))
        keys = [f"{p}{_direction(draw)}" for p in ordered]
        if not distinct:
            keys += [*source.unique]  # the output may repeat: ties broken by the rows' key
    else:
        first = draw(st.lists(st.sampled_from([*exprs[: len(columns)], f"{source.numbers[0]} - 1"]), max_size=2))
        keys = [f"{k.split(' AS ')[0]}{_direction(draw)}" for k in first] + [
            f"{k}{_direction(draw)}" for k in source.unique
        ]
    if distinct and draw(st.booleans()):
        keys = [f"{source.unique[0]}", *keys]  # an expression under DISTINCT: refused by name
        may_refuse = True
    sql = f"{head} ORDER BY {', '.join(keys)}{_limit(draw)}"
    return Query(sql, sql, ordered=True, may_refuse=may_refuse)


_AGGREGATES = (
    "count(*)",
    "count({n})",
    "sum({n})",
    "min({n})",
    "max({n})",
    "avg({n})",
    "min({t})",
    "max({t})",
    "count(DISTINCT {t})",
    "sum(DISTINCT {n})",
    "median({n})",
    "quantile_cont({n}, 0.25)",
    "bool_or({n} > 0)",
    "bool_and({n} IS NOT NULL)",
    "string_agg(DISTINCT {t}, ',' ORDER BY {t})",
    "list({n} ORDER BY {n} NULLS FIRST)",
    "count(*) FILTER (WHERE {n} > 0)",
    "sum({n}) FILTER (WHERE {n} < 1)",
    "max({n}) - min({n})",
    "sum({n}) / count(*)",
    "avg({n}) FILTER (WHERE {n} IS NOT NULL)",
)
_EXACT_ORDER = frozenset({"count(*)", "count({n})", "sum({n})", "min({n})", "max({n})", "min({t})"})
"""Aggregates whose merged value equals one DuckDB's to the bit, so ordering by them is deterministic."""
_PARTIAL = frozenset(
    {*_EXACT_ORDER, "avg({n})", "max({t})", "bool_or({n} > 0)", "bool_and({n} IS NOT NULL)", "max({n}) - min({n})"}
    | {"sum({n}) / count(*)"}
)
"""Aggregates merged from the shards' partial states (the others from their inputs)."""


@st.composite
def aggregate_queries(draw: st.DrawFn) -> Query:
    cte, source = _with_cte(draw, draw(st.sampled_from(SOURCES)))
    groups = draw(st.lists(st.sampled_from([*source.keys, f"{source.numbers[-1]} % 3"]), max_size=2, unique=True))
    forms = draw(st.lists(st.sampled_from(_AGGREGATES), min_size=1, max_size=3, unique=True))
    aggregates = [
        f.format(n=draw(st.sampled_from(source.numbers)), t=draw(st.sampled_from(source.texts))) for f in forms
    ]
    if draw(st.integers(0, 5)) == 0:
        return _shadowing(draw, cte, source)
    names = [f"g{i}" for i in range(len(groups))]
    style = draw(st.sampled_from(["expressions", "positions", "aliases", "all"]))
    select_groups = [f"{g} AS {n}" if style == "aliases" or "%" in g else g for g, n in zip(groups, names, strict=True)]
    select_groups = [_qualified(draw, source, g) for g in select_groups]
    if style == "aliases":
        by = names
    elif style == "positions":
        by = [str(i + 1) for i in range(len(groups))]
    else:
        by = groups
    bare = draw(st.booleans()) and style != "aliases"  # the merge names columns as DuckDB does
    select = ", ".join([*select_groups, *(a if bare else f"{a} AS a{i}" for i, a in enumerate(aggregates))])
    first = aggregates[0] if bare else "a0"
    sql = f"{cte}SELECT {select} FROM {source.sql}{_where(draw, source)}"
    if groups:
        sql += " GROUP BY ALL" if style == "all" else f" GROUP BY {', '.join(by)}"
    if draw(st.booleans()):
        sql += draw(
            st.sampled_from(
                [" HAVING count(*) > 1", f" HAVING max({source.numbers[0]}) > 0", f" HAVING {first} IS NOT NULL"]
            )
        )
    if not groups:
        return Query(sql + _limit(draw), sql, ordered=True)  # one row
    if draw(st.booleans()):
        return Query(sql, sql, ordered=False)
    exact = [
        a if bare else f"a{i}" for i, (f, a) in enumerate(zip(forms, aggregates, strict=True)) if f in _EXACT_ORDER
    ]
    leading = draw(st.lists(st.sampled_from(exact), max_size=1)) if exact else []
    keys = [*leading, *(str(i + 1) if style == "positions" else g for i, g in enumerate(groups))]
    if style == "aliases":
        keys = [*leading, *names]
    sql += f" ORDER BY {', '.join(f'{k}{_direction(draw)}' for k in keys)}{_limit(draw)}"
    return Query(sql, sql, ordered=True)


def _qualified(draw: st.DrawFn, source: Source, expr: str) -> str:
    """``steps.run_id`` for ``run_id`` now and then (the same column with its table's name)."""
    if source.sql == "steps" and expr in source.keys and draw(st.booleans()):
        return f"steps.{expr}"
    return expr


def _shadowing(draw: st.DrawFn, cte: str, source: Source) -> Query:
    """``SELECT <expr> AS rank, count(*) FROM ... GROUP BY rank``: the name is the column, not the item."""
    name = source.keys[1]
    item = draw(st.sampled_from([f"CAST({name} AS VARCHAR) || '!'", "42", f"{name} IS NULL", "'x'"]))
    order = draw(st.sampled_from(["", f" ORDER BY n, {name}", f" ORDER BY {name} DESC, n"]))
    sql = f"{cte}SELECT {item} AS {name}, count(*) AS n FROM {source.sql} GROUP BY {name}{order}"
    return Query(sql, sql, ordered=bool(order))  # n and the column order the groups totally


@st.composite
def scalar_queries(draw: st.DrawFn) -> Query:
    """``SELECT (SELECT count(*) FROM steps WHERE ...) AS a, ...``: no FROM, a subquery per item."""
    items, inner = [], False
    for i in range(draw(st.integers(1, 3))):
        source = draw(st.sampled_from(SOURCES[:3]))
        form = draw(st.sampled_from([f for f in _AGGREGATES if "FILTER" not in f]))
        inner = inner or form not in _PARTIAL
        aggregate = form.format(n=source.numbers[0], t=source.texts[0])
        items.append(f"(SELECT {aggregate} FROM {source.sql}{_where(draw, source)}) AS s{i}")
    if draw(st.booleans()):
        items.append("'tag' AS tag")
    cte = "WITH s AS (SELECT * FROM steps WHERE loss > 0) " if draw(st.booleans()) else ""
    if cte:
        items.append("(SELECT count(*) FROM s) AS positive")
    sql = f"{cte}SELECT {', '.join(items)}"
    return Query(sql, sql, ordered=True, may_refuse=inner)  # only partial states merge there (refused by name)


_REFUSED = (
    "SELECT run_id, row_number() OVER (ORDER BY step) AS n FROM steps",
    "SELECT run_id, step FROM steps QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY step DESC) = 1",
    "SELECT run_id, count(*) FROM steps GROUP BY ROLLUP (run_id)",
    "SELECT run_id, rank, count(*) FROM steps GROUP BY GROUPING SETS ((run_id), (rank))",
    "SELECT run_id FROM steps UNION SELECT run_id FROM runs",
    "SELECT DISTINCT ON (run_id) run_id, step FROM steps ORDER BY run_id, step",
    "SELECT run_id, sum(loss) OVER (PARTITION BY run_id) FROM steps",
    "SELECT run_id FROM steps LIMIT 10 PERCENT",
)


@st.composite
def refused_queries(draw: st.DrawFn) -> Query:
    return Query(sql := draw(st.sampled_from(_REFUSED)), sql, ordered=False, may_refuse=True)


queries = st.one_of(row_queries(), aggregate_queries(), scalar_queries(), refused_queries())


# ---- the oracle -----------------------------------------------------------------------------------------


def across_shards(sql: str, shards: list[duckdb.DuckDBPyConnection]) -> QueryResult:
    """``sql`` answered as ``vigil sql`` answers it across shards: each shard its part, then the merge."""
    split_plan = plan(sql)
    answers = {i: run_query(con, split_plan.shard_sql, LIMIT, TIMEOUT) for i, con in enumerate(shards)}
    return merge(split_plan, Gathered(len(shards), answers), LIMIT, TIMEOUT)


def _value(v: Any) -> Any:
    if isinstance(v, float) and not math.isnan(v):
        return pytest.approx(v, rel=1e-9, abs=1e-12)
    if isinstance(v, list):
        return [_value(x) for x in v]
    return v


def _sortable(row: list[Any]) -> str:
    return repr([round(v, 9) if isinstance(v, float) else v for v in row])


def assert_same_answer(query: Query, merged: QueryResult, whole: QueryResult, unlimited: QueryResult | None) -> None:
    assert (merged.columns, merged.types) == (whole.columns, whole.types), query.sql
    assert not merged.truncated and not whole.truncated, query.sql
    if query.ordered:
        assert merged.rows == [_value(r) for r in whole.rows], query.sql
    elif unlimited is not None:  # LIMIT without ORDER BY: as many rows, each one of the answer's
        assert len(merged.rows) == len(whole.rows), query.sql
        assert not Counter(map(_sortable, merged.rows)) - Counter(map(_sortable, unlimited.rows)), query.sql
    else:
        assert sorted(merged.rows, key=_sortable) == [_value(r) for r in sorted(whole.rows, key=_sortable)], query.sql


def check(query: Query, history: History) -> None:
    shards, whole = split(history)
    try:
        merged = across_shards(query.sql, shards)
    except QueryRefusedError as exc:
        assert query.may_refuse, f"{query.sql!r} was refused: {exc}"
        assert str(exc), query.sql  # a refusal says why
        return
    assert not query.may_refuse or query.sql not in _REFUSED, f"{query.sql!r} was merged, not refused"
    expected = run_query(whole, query.sql, LIMIT, TIMEOUT)
    unlimited = run_query(whole, query.unlimited, LIMIT, TIMEOUT) if query.unlimited != query.sql else None
    assert_same_answer(query, merged, expected, unlimited)


@FUZZ
@given(query=queries, history=histories())
def test_a_query_across_shards_answers_what_one_duckdb_answers_or_is_refused(query: Query, history: History) -> None:
    check(query, history)


# ---- what the fuzzing found, pinned -----------------------------------------------------------------------

TWO_RUNS = History(
    2,
    {
        "runs": [("run-a", "done", 1), ("run-b", "running", 2)],
        "steps": [
            ("run-a", 0, 1, 0.5, None),
            ("run-a", 0, 4, 1.0, 0.25),
            ("run-b", 0, 2, None, 0.5),
            ("run-b", 1, 2, 0.25, None),
        ],
        "anomalies": [("run-b", 1, 2, "straggler", "warn", 0.5)],
    },
)
"""Runs on both shards of two (run-a on one, run-b with two ranks on the other), steps 1 and 4 in one bucket of
``step % 3``, NULLs in both value columns."""
assert len({shard_of(r[0], 2) for r in TWO_RUNS.rows["runs"]}) == 2


@pytest.mark.parametrize(
    "sql",
    [
        # A GROUP BY name that is a column and an alias of another item: DuckDB groups by the column.
        "SELECT step % 3 AS step, count(*) AS n FROM steps GROUP BY step ORDER BY n, step",
        "SELECT 42 AS rank, count(*) AS n FROM steps GROUP BY rank ORDER BY n",
        # A constant item named by position or by GROUP BY ALL is a group of its own, not a position.
        "SELECT 42, run_id, count(*) AS n FROM steps GROUP BY 1, 2 ORDER BY run_id",
        "SELECT 'x' AS tag, 7, count(*) AS n FROM steps GROUP BY ALL",
        "SELECT run_id AS rank, count(*) AS n FROM steps GROUP BY run_id, rank ORDER BY 1, n",
        # ...and a name that is only an alias names the item.
        "SELECT step % 3 AS bucket, count(*) AS n FROM steps GROUP BY bucket HAVING bucket > 0 ORDER BY bucket",
    ],
)
def test_a_group_by_name_means_what_duckdb_binds_it_to(sql: str) -> None:
    check(Query(sql, sql, ordered=True), TWO_RUNS)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT run_id, count(*) AS n FROM steps GROUP BY run_id ORDER BY steps.run_id",
        "SELECT steps.run_id, max(loss) AS m FROM steps GROUP BY run_id HAVING max(steps.loss) > 0 ORDER BY 1",
        "SELECT run_id, count(*) AS n FROM steps GROUP BY steps.run_id ORDER BY run_id DESC",
    ],
)
def test_a_column_named_with_or_without_its_table_is_the_same_group_key(sql: str) -> None:
    check(Query(sql, sql, ordered=True), TWO_RUNS)


def test_a_cte_reaches_the_scalar_subqueries_of_a_select_without_from() -> None:
    sql = "WITH s AS (SELECT * FROM steps WHERE loss > 0.3) SELECT (SELECT count(*) FROM s), (SELECT max(step) FROM s)"
    check(Query(sql, sql, ordered=True), TWO_RUNS)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT run_id, loss FROM steps ORDER BY grad_norm ASC NULLS FIRST, run_id, step",
        "SELECT run_id, grad_norm FROM steps ORDER BY 2 DESC NULLS LAST, run_id, step LIMIT 2",
        "SELECT run_id, max(grad_norm) AS g FROM steps GROUP BY run_id ORDER BY g NULLS FIRST, run_id",
    ],
)
def test_nulls_first_or_last_orders_the_merged_answer_too(sql: str) -> None:
    check(Query(sql, sql, ordered=True), TWO_RUNS)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT loss AS step, run_id FROM steps ORDER BY step DESC, run_id LIMIT 2",
        "SELECT run_id, step AS s, -loss AS rank FROM steps ORDER BY rank NULLS FIRST, run_id, steps.step",
    ],
)
def test_order_by_an_alias_that_is_also_a_column_orders_by_the_alias(sql: str) -> None:
    check(Query(sql, sql, ordered=True), TWO_RUNS)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*), count(loss), sum(loss), avg(loss), min(run_id), median(step) FROM steps",
        "SELECT run_id, count(*) FROM steps GROUP BY run_id",
        "SELECT (SELECT count(*) FROM runs) AS known, (SELECT avg(loss) FROM steps) AS mean",
        "SELECT * FROM steps ORDER BY step LIMIT 3",
    ],
)
def test_shards_without_rows_answer_what_an_empty_history_answers(sql: str) -> None:
    check(Query(sql, sql, ordered=True), History(3, {table: [] for table in TABLES}))
