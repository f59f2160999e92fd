"""``vigil sql`` never cuts an answer silently: a real daemon, a real file, the real command line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Daemon, NatsServer, finish, run_producer, wait_for

from trainvigil.daemon.cli.main import EXIT_OK, EXIT_TRUNCATED

ROWS = 10_050  # more than the daemon's default query_row_limit (10 000)


def _vigil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainvigil.daemon.cli", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def default_daemon(nats_server: NatsServer, tmp_path: Path) -> Iterator[Daemon]:
    """A daemon with the shipped query budgets (tests/support.py raises the row limit for other tests)."""
    d = Daemon(nats_server.url, tmp_path / "data", env={"VIGIL_QUERY_ROW_LIMIT": "10000"})
    d.start()
    finish(run_producer(nats_server.url, "big", 0, ROWS))
    wait_for(lambda: d.scalar("select count(*) from steps where run_id = 'big'") == ROWS, 60, f"{ROWS} rows")
    yield d
    if d.process is not None and d.process.poll() is None:
        d.kill()


def test_the_readme_recipe_past_the_daemons_row_limit_says_so_and_exits_4(
    default_daemon: Daemon, nats_server: NatsServer
) -> None:
    """The issue's reproduction: --limit 10000000 while the daemon caps answers at 10 000 rows."""
    done = _vigil(
        "sql", "select step, loss from steps order by step", "--format", "csv", "--limit", "10000000",
        "--nats", nats_server.url,
    )  # fmt: skip
    assert done.returncode == EXIT_TRUNCATED, (done.returncode, done.stderr)
    assert len(done.stdout.splitlines()) == 1 + 10_000  # what came is still printed, header first
    err = done.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("vigil: truncated: 10000 rows returned"), err
    assert "query_row_limit" in err and "vigil export" in err, err


def test_a_default_query_past_the_row_limit_is_not_silent(default_daemon: Daemon, nats_server: NatsServer) -> None:
    done = _vigil("sql", "select * from steps", "--nats", nats_server.url, "--format", "json")
    assert done.returncode == EXIT_TRUNCATED and "10000 rows returned" in done.stderr, done.stderr


def test_an_answer_within_the_limit_exits_0_without_a_word(default_daemon: Daemon, nats_server: NatsServer) -> None:
    done = _vigil("sql", "select step from steps limit 10000", "--nats", nats_server.url, "--format", "csv")
    assert done.returncode == EXIT_OK and done.stderr == "", done.stderr
    assert len(done.stdout.splitlines()) == 1 + 10_000


def test_the_byte_budget_cut_is_named(nats_server: NatsServer, tmp_path: Path) -> None:
    d = Daemon(nats_server.url, tmp_path / "bytes", env={"VIGIL_QUERY_MAX_BYTES": "4096"})
    d.start()
    try:
        done = _vigil("sql", "select repeat('x', 100) from range(1000)", "--nats", nats_server.url, "--format", "csv")
    finally:
        d.kill()
    assert done.returncode == EXIT_TRUNCATED, done.stderr
    assert "byte budget" in done.stderr and "query_max_bytes" in done.stderr, done.stderr


def test_reading_the_file_without_a_daemon_says_so_too(default_daemon: Daemon, nats_server: NatsServer) -> None:
    assert default_daemon.terminate() == 0
    nats_server.stop()
    done = _vigil(
        "sql", "select step from steps", "--limit", "500", "--format", "csv",
        "--nats", nats_server.url, "--data-dir", str(default_daemon.data_dir),
    )  # fmt: skip
    assert done.returncode == EXIT_TRUNCATED, done.stderr
    assert len(done.stdout.splitlines()) == 1 + 500
    lines = done.stderr.strip().splitlines()
    assert "answered from" in lines[0] and lines[1].startswith("vigil: truncated: 500 rows returned"), lines
    assert "--limit 500" in lines[1], lines
