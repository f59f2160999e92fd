"""``vigil sql`` never cuts an answer silently: a real daemon, a real file, the real command line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess import InProcessDaemon
from support import Daemon, NatsServer, SqlOverNats, finish, run_producer, serving, vigil, wait_for

from trainvigil.daemon.cli.main import EXIT_OK, EXIT_TRUNCATED

ROWS = 10_050  # more than the daemon's default query_row_limit (10 000)


SHIPPED = {"VIGIL_QUERY_ROW_LIMIT": "10000"}
"""The shipped query budgets (tests/_support/support.py raises the row limit for other tests)."""


def _fill(d: SqlOverNats) -> None:
    finish(run_producer(d.nats_url, "big", 0, ROWS))
    wait_for(lambda: d.scalar("select count(*) from steps where run_id = 'big'") == ROWS, 60, f"{ROWS} rows")


@pytest.fixture(scope="module")
def default_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with the :data:`SHIPPED` budgets holding run ``big`` on a broker of its own, filled once for the
    tests that only ask it."""
    with serving(tmp_path_factory.mktemp("truncation"), SHIPPED) as d:
        _fill(d)
        yield d


def test_the_readme_recipe_past_the_daemons_row_limit_says_so_and_exits_4(default_daemon: Daemon) -> None:
    """The reproduction: --limit 10000000 while the daemon caps answers at 10 000 rows."""
    done = vigil(
        "sql", "select step, loss from steps order by step", "--format", "csv", "--limit", "10000000",
        "--nats", default_daemon.nats_url,
    )  # fmt: skip
    assert done.returncode == EXIT_TRUNCATED, (done.returncode, done.stderr)
    assert len(done.stdout.splitlines()) == 1 + 10_000  # what came is still printed, header first
    err = done.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("vigil: truncated: 10000 rows returned"), err
    assert "query_row_limit" in err and "vigil export" in err, err


def test_a_default_query_past_the_row_limit_is_not_silent(default_daemon: Daemon) -> None:
    done = vigil("sql", "select * from steps", "--nats", default_daemon.nats_url, "--format", "json")
    assert done.returncode == EXIT_TRUNCATED and "10000 rows returned" in done.stderr, done.stderr


def test_an_answer_within_the_limit_exits_0_without_a_word(default_daemon: Daemon) -> None:
    done = vigil("sql", "select step from steps limit 10000", "--nats", default_daemon.nats_url, "--format", "csv")
    assert done.returncode == EXIT_OK and done.stderr == "", done.stderr
    assert len(done.stdout.splitlines()) == 1 + 10_000


def test_the_byte_budget_cut_is_named(nats_server: NatsServer, tmp_path: Path) -> None:
    d = InProcessDaemon(nats_server.url, tmp_path / "bytes", env={"VIGIL_QUERY_MAX_BYTES": "4096"})
    d.start()
    try:
        done = vigil("sql", "select repeat('x', 100) from range(1000)", "--nats", nats_server.url, "--format", "csv")
    finally:
        d.close()
    assert done.returncode == EXIT_TRUNCATED, done.stderr
    assert "byte budget" in done.stderr and "query_max_bytes" in done.stderr, done.stderr


def test_reading_the_file_without_a_daemon_says_so_too(private_nats_server: NatsServer, tmp_path: Path) -> None:
    d = InProcessDaemon(private_nats_server.url, tmp_path / "data", env=SHIPPED)  # its own: this test stops it
    d.start()
    try:
        _fill(d)
    finally:
        assert d.terminate() == 0
    private_nats_server.stop()
    done = vigil(
        "sql", "select step from steps", "--limit", "500", "--format", "csv",
        "--nats", private_nats_server.url, "--data-dir", str(d.data_dir),
    )  # fmt: skip
    assert done.returncode == EXIT_TRUNCATED, done.stderr
    assert len(done.stdout.splitlines()) == 1 + 500
    lines = done.stderr.strip().splitlines()
    assert "answered from" in lines[0] and lines[1].startswith("vigil: truncated: 500 rows returned"), lines
    assert "--limit 500" in lines[1], lines
