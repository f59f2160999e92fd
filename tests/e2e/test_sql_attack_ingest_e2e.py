"""Attack queries while a run logs: ingest keeps committing, every step lands once, the daemon lives.

The attack queries (a result as large as memory, a list of 10^8 values, a cross
join of 10^9 x 10^9, a delete hidden in a CTE) go to a real daemon through ``vigil sql`` while a real
training process logs 4 000 steps over ~8 s. The one timing asserted is a guard against starvation:
commits never stop for longer than a bound far above their normal pace (a batch every ~0.25 s).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Daemon, NatsServer, finish, run_producer, wait_for

from trainvigil.testing import steps_committed

ATTACKS = (
    "select repeat('x', 600000) as s from range(10000)",
    "select list(i) from range(100000000) t(i)",
    "select count(*) from range(1000000000) a, range(1000000000) b",
    "with x as (delete from steps returning *) select count(*) from x",
)
STEPS = 4_000
LONGEST_PAUSE_S = 5.0
"""Commits may pause this long at most while a run logs (normally ~0.25 s between batches)."""


@pytest.fixture
def daemon(nats_server: NatsServer, tmp_path: Path) -> Iterator[Daemon]:
    """A daemon whose queries time out after 5 s (the cross join would take 30 s by default)."""
    d = Daemon(nats_server.url, tmp_path / "data", env={"VIGIL_QUERY_TIMEOUT_S": "5"})
    d.start()
    yield d
    d.kill()


@pytest.mark.serial  # bounds the pause between commits
def test_attack_queries_during_ingest_cost_no_step_and_never_stall_commits(
    daemon: Daemon, nats_server: NatsServer
) -> None:
    assert daemon.process is not None
    producer = run_producer(nats_server.url, "attacked", 0, STEPS, "--pace", "0.002")
    answers: list[int] = []

    def attack() -> None:
        for sql in ATTACKS:
            args = ["sql", sql, "--nats", nats_server.url, "--format", "csv"]
            done = subprocess.run(
                [sys.executable, "-m", "trainvigil.daemon.cli", *args], capture_output=True, text=True, timeout=90
            )
            answers.append(done.returncode)

    attacker = threading.Thread(target=attack)
    attacker.start()
    samples: list[tuple[float, int]] = []
    while producer.poll() is None or attacker.is_alive():
        samples.append((time.monotonic(), steps_committed(daemon.http_port)))
        time.sleep(0.1)
    attacker.join()
    finish(producer)
    try:
        wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'attacked'") == STEPS, 60, "steps")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; the daemon's log ends with:\n{daemon.log.read_text()[-3000:]}") from exc
    assert daemon.scalar("select count(distinct step) from steps where run_id = 'attacked'") == STEPS
    assert daemon.scalar("select count(*) from dead_letters") == 0, "a query's memory is no fault of a message"
    assert daemon.process.poll() is None, "the daemon was not killed"
    assert answers and all(code in (1, 4) for code in answers), f"each attack refused, cut or interrupted: {answers}"
    # While the run was still logging, commits never paused past the guard.
    logging = [(t, n) for t, n in samples if n < STEPS]
    changes = [t for (t, n), (_, before) in zip(logging[1:], logging, strict=False) if n != before]
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    assert changes, "commits were seen while the run logged"
    assert max(gaps, default=0.0) < LONGEST_PAUSE_S, f"commits paused {max(gaps):.1f} s under attack"
