"""A read query's memory stays within ``query_memory_bytes``: a real daemon, the real ``vigil sql``.

The guard interrupts a query once the daemon grew by ``query_memory_bytes``, but DuckDB checks for an
interrupt only between vectors of 2 048 rows: one call that makes a huge value (``repeat('x', 1e9)``, a
scalar ``range(2e7)``) or a vector of 2 048 big ones grew the daemon by gigabytes before it could stop.
Such calls are refused before they run; what the guard stops (aggregates, sorts, recursive doubling) it
stops soon enough. Each bomb is measured by the daemon's peak resident memory (``VmHWM``, reset before
the query through ``/proc/PID/clear_refs``) against the memory it held when the query began.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from support import Daemon, finish, run_producer, serving, vigil, wait_for

from trainvigil.daemon.cli.main import EXIT_QUERY
from trainvigil.daemon.store.query import run_query
from trainvigil.errors import QueryRefusedError

MiB = 2**20
BUDGET = 64 * MiB
BOUND = 4 * BUDGET
"""Peak growth a bomb may cause: the budget, the vector DuckDB was computing when the guard interrupted it,
its Arrow copy, and slack for what the daemon allocates meanwhile. Before values were refused up front, the
bombs below grew the daemon by 0.5-2 GiB."""

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="measures the daemon's peak RSS through /proc (Linux)"
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose queries may grow it by 64 MiB, on a broker of its own.

    The spill guard is set out of reach: these tests are about the memory guard, and a sort that spills (``order
    by random()``) would otherwise race it to its default 256 MiB, whichever of the two the guard's poll sees first.
    """
    env = {"VIGIL_QUERY_MEMORY_BYTES": str(BUDGET), "VIGIL_QUERY_SPILL_BYTES": str(2**40)}
    with serving(tmp_path_factory.mktemp("query-memory"), env) as d:
        yield d


def _status(daemon: Daemon, key: str) -> int:
    """``VmRSS`` or ``VmHWM`` of the daemon process, in bytes."""
    assert daemon.process is not None
    status = Path(f"/proc/{daemon.process.pid}/status").read_text()
    match = re.search(rf"^{key}:\s+(\d+) kB", status, re.MULTILINE)
    assert match, status
    return int(match.group(1)) * 1024


def _sql(daemon: Daemon, sql: str) -> tuple[str, int]:
    """Run ``sql`` through ``vigil sql``; its stderr (it must fail) and how far it raised the daemon's peak RSS."""
    assert daemon.process is not None
    Path(f"/proc/{daemon.process.pid}/clear_refs").write_text("5")  # the peak starts again from the current RSS
    before = _status(daemon, "VmRSS")
    done = vigil("sql", sql, "--nats", daemon.nats_url, "--format", "csv", timeout=120)
    growth = _status(daemon, "VmHWM") - before
    assert done.returncode == EXIT_QUERY, (done.returncode, done.stdout[:200], done.stderr)
    return done.stderr.strip(), growth


REFUSED = [
    "select repeat('x', 1000000000)",  # one 1 GB value
    "select repeat('x', 600000) as s from range(10000)",  # 2 048 rows of 600 kB: one vector of 1.2 GB
    "select md5(repeat('y', 500000000))",  # a huge value inside an answer of 32 bytes
    "select range(20000000)",  # a scalar range: one list of 20 M numbers
    "select lpad('x', 300000000, 'y')",
    "select printf('%1000000000d', 1)",
    "select list_resize([1], 10000000)",
    "select repeat(repeat('x', 30000), 30000)",  # each count small, together 900 MB
]


@pytest.mark.parametrize("sql", REFUSED)
def test_a_call_that_makes_one_huge_value_is_refused_before_it_runs(daemon: Daemon, sql: str) -> None:
    err, growth = _sql(daemon, sql)
    assert "refused" in err and "query_memory_bytes" in err, err
    assert growth <= BOUND, f"the daemon grew by {growth >> 20} MiB"
    assert daemon.scalar("select 42") == 42, "the next query is answered"


INTERRUPTED = [
    "select list(i) from range(100000000) t(i)",
    "select i, repeat('x', 1000) from range(10000000) t(i) order by random()",
    "with recursive t(s, n) as (select 'x', 0 union all select s || s, n + 1 from t where n < 31)"
    " select max(length(s)) from t",  # doubles a string until the guard sees it
]


@pytest.mark.serial  # a starved guard thread lets the query grow past the bound
@pytest.mark.parametrize("sql", INTERRUPTED)
def test_a_query_that_grows_step_by_step_is_stopped_within_the_bound(daemon: Daemon, sql: str) -> None:
    err, growth = _sql(daemon, sql)
    assert "query_memory_bytes" in err, err
    assert growth <= BOUND, f"the daemon grew by {growth >> 20} MiB"
    assert daemon.scalar("select 42") == 42


def test_after_a_bomb_the_daemon_gives_its_memory_back(daemon: Daemon) -> None:
    """The memory of an interrupted query goes back to the system (DuckDB's allocator keeps it a second)."""
    before = _status(daemon, "VmRSS")
    err, _ = _sql(daemon, "select string_agg(repeat('x', 1000), '') from range(1000000)")
    assert "query_memory_bytes" in err, err
    wait_for(lambda: _status(daemon, "VmRSS") <= before + BUDGET, 15, "the daemon's RSS back near where it was")


def test_ordinary_uses_of_those_functions_are_answered(daemon: Daemon) -> None:
    sql = (
        "select repeat('-', 80), lpad('7', 3, '0'), rpad('a', 5, '.'), range(5), generate_series(1, 3),"
        " printf('%5.2f', 1.5), format('{:>6}', 'ab'), list_resize([1], 3), (select count(*) from range(1000000)),"
        " (select count(*) from repeat('x', 3))"
    )
    row = daemon.sql(sql).rows[0]
    assert row[:3] == ["-" * 80, "007", "a...."]
    assert row[3:5] == [[0, 1, 2, 3, 4], [1, 2, 3]]
    assert row[5:] == [" 1.50", "    ab", [1, None, None], 1_000_000, 3]


def test_a_size_that_is_not_written_in_the_query_is_refused(daemon: Daemon) -> None:
    """A count from a column could be anything by the time DuckDB computes it: refused, saying what to write."""
    done = vigil("sql", "select repeat('x', i) from range(3) t(i)", "--nats", daemon.nats_url)
    assert done.returncode == EXIT_QUERY and "refused" in done.stderr, done.stderr
    assert "repeat()" in done.stderr and "number written in the query" in done.stderr, done.stderr


def test_the_daemon_keeps_ingesting_after_the_bombs(daemon: Daemon) -> None:
    for sql in (REFUSED[0], INTERRUPTED[0]):
        _sql(daemon, sql)
    finish(run_producer(daemon.nats_url, "after-bombs", 0, 200))
    wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'after-bombs'") == 200, 60, "200 rows")


@pytest.mark.parametrize(
    "sql",
    [
        "select repeat('x', 1000 * 1000 * 1000)",
        "select 'x'.repeat(10 ^ 9)",
        "select main.repeat('ab', '100000000'::bigint)",
        "select repeat(x'00', 1e9)",
        "select [repeat('x', 40000) || repeat('y', 40000)]",
        "select generate_series(timestamp '2000-01-01', timestamp '2100-01-01', interval 1 second)",
        "select format('{:>{}}', 'x', 1000000000)",
        "select to_base(1, 2, 1000000000)",
        "select list_transform([1, 2], x -> repeat('x', x))",
    ],
)
def test_sizes_spelled_in_other_ways_are_read_or_refused(sql: str) -> None:
    """Pure check, no daemon: arithmetic, casts, method calls and lambdas cannot hide a size."""
    with duckdb.connect() as con, pytest.raises(QueryRefusedError, match="query_memory_bytes"):
        run_query(con, sql, 10, 10, memory_bytes=BUDGET)


def test_a_table_function_of_the_same_name_makes_rows_and_is_not_checked() -> None:
    with duckdb.connect() as con:
        result = run_query(con, "select count(*) from range(10000000), repeat('x', 3)", 10, 30, memory_bytes=BUDGET)
    assert result.rows == [[30_000_000]]
