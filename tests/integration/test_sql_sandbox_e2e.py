"""The SQL sandbox through a real nats-server, a real daemon process and the real ``vigil sql``."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Daemon, NatsServer, finish, run_producer, serving, vigil, wait_for

from trainvigil.daemon.cli.sqlclient import ask_daemon
from trainvigil.schemas.query import QueryRequest, QueryResult

GiB = 2**30


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon on a broker of its own for the tests that ask it: none of them can change what it holds."""
    with serving(tmp_path_factory.mktemp("sandbox")) as d:
        yield d


def _ask(daemon: Daemon, request: QueryRequest, timeout: float = 30) -> QueryResult:
    result = asyncio.run(ask_daemon(daemon.nats_url, request, timeout, subjects=daemon.subjects))
    assert result is not None, "no daemon answered"
    return result


def _peak_rss(daemon: Daemon) -> int:
    """The daemon process's high-water mark of resident memory (VmHWM), in bytes."""
    assert daemon.process is not None
    status = Path(f"/proc/{daemon.process.pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    assert match, status
    return int(match.group(1)) * 1024


def _alive(daemon: Daemon) -> bool:
    return daemon.process is not None and daemon.process.poll() is None and daemon.scalar("select 42") == 42


def test_a_delete_hidden_in_a_cte_is_refused_and_deletes_nothing(daemon: Daemon) -> None:
    finish(run_producer(daemon.nats_url, "cte", 0, 100))
    wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'cte'") == 100, 30, "100 rows")
    result = vigil(
        "sql", "with x as (delete from steps returning *) select count(*) from x", "--nats", daemon.nats_url, timeout=60
    )
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "refused" in result.stderr and "DELETE" in result.stderr
    assert daemon.scalar("select count(*) from steps where run_id = 'cte'") == 100


@pytest.mark.serial  # a peak-RSS bound a starved guard misses
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the daemon's peak RSS from /proc")
def test_memory_attacks_get_an_answer_and_the_daemon_stays_small(daemon: Daemon) -> None:
    for sql in ["select repeat('x', 600000) as s from range(10000)", "select list(i) from range(100000000) t(i)"]:
        started = time.monotonic()
        result = vigil("sql", sql, "--nats", daemon.nats_url, "--format", "csv", timeout=60)
        assert time.monotonic() - started < 20
        # Either a cut answer (exit 4, said on stderr) or a clear error naming the budget (exit 1); never a
        # dead daemon. Either way stderr names the budget.
        assert result.returncode in (1, 4), result.stderr
        assert "query_memory_bytes" in result.stderr or "query_max_bytes" in result.stderr, result.stderr
        assert _alive(daemon), "the daemon survived and still answers"
    assert _peak_rss(daemon) < 1.5 * GiB


def test_a_negative_limit_on_the_wire_is_answered_at_once(daemon: Daemon) -> None:
    started = time.monotonic()
    result = _ask(daemon, QueryRequest(sql="select 1", limit=-2), timeout=5)
    assert result.refused and "$.limit" in result.error, result.error
    assert time.monotonic() - started < 3


def test_beyond_query_concurrency_a_request_is_told_busy_at_once(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIGIL_QUERY_CONCURRENCY", "1")
    daemon = Daemon(nats_server.url, tmp_path / "busy-data")
    daemon.start()
    try:
        slow: list[QueryResult] = []

        def run_slow() -> None:
            # Until it gets the slot itself: under load a probe below may hold it when this one arrives. It holds
            # the slot 4 s: dozens of probes' time, each asking every 50 ms.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                answer = _ask(daemon, QueryRequest(sql="select sum(i) from range(100000000000) t(i)", timeout_s=4))
                if not answer.error.startswith("busy"):
                    slow.append(answer)
                    return

        worker = threading.Thread(target=run_slow)
        worker.start()
        busy = wait_for(
            lambda: (r := _ask(daemon, QueryRequest(sql="select 1"), timeout=5)).error.startswith("busy") and r,
            15,
            "a busy answer while the slow query runs",
        )
        assert "query_concurrency" in busy.error
        worker.join(60)
        assert slow and "interrupted after 4 s" in slow[0].error, slow
        assert _alive(daemon)
    finally:
        daemon.kill()
