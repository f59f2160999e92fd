"""A process that dies pages once: one liveness episode per (run, rank) that escalates, not one page per detector.

Real processes: nats-server and a training script that is SIGKILLed (no ``run_end``, no atexit); the daemon is
``vigil up``'s own ``serve`` in this process, with its silence horizons made test-sized. The alert updates are
read as ``vigil alerts --follow`` reads them (NATS), the episodes as ``vigil alerts`` lists them (SQL).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleet import AlertWatch
from inprocess import InProcessDaemon
from support import NatsServer, wait_for

from trainvigil.daemon.cli.cmd_alerts import alerts_sql
from trainvigil.daemon.cli.cmd_runs import RUNS_SQL
from trainvigil.schemas import Anomaly

SETTINGS = {
    "VIGIL_DETECTORS_STALL_MIN_SECONDS": "2",
    "VIGIL_DETECTORS_RUN_FAILED_LOST_AFTER_S": "6",
    "VIGIL_DETECTORS_HANG_MIN_SECONDS": "3",
    "VIGIL_DETECTORS_HANG_ALIVE_S": "5",
}
"""Silent 2 s pages ``stall``, 6 s is lost; no step for 3 s while heartbeats come is a hang."""

KILLED = """
import itertools, time, trainvigil
vigil = trainvigil.init(run_id="killed")
for step in itertools.count():  # trains until the test kills it
    vigil.log(step, loss=1.0, step_time=0.02)
    time.sleep(0.02)
    if step == 19:
        vigil.flush(10)
        print("logged", flush=True)
"""

HUNG = """
import sys, time, trainvigil
vigil = trainvigil.init(run_id="hung")

def fake_all_reduce():
    sys.stdin.readline()  # blocked, as a collective whose peers are gone: heartbeats go on, steps do not

for step in range(40):
    vigil.log(step, loss=1.0 / (step + 1), step_time=0.01)
    time.sleep(0.01)
print("blocking", flush=True)
fake_all_reduce()
"""


@pytest.fixture
def liveness_daemon(nats_server: NatsServer, tmp_path: Path) -> Iterator[InProcessDaemon]:
    d = InProcessDaemon(nats_server.url, tmp_path / "data", env=SETTINGS)
    d.start()
    yield d
    d.close()


def _killed_until_lost(
    url: str, script: str, run_id: str, says: str, ready: Callable[[AlertWatch], None]
) -> list[Anomaly]:
    """Run ``script``, SIGKILL it (no ``run_end``, no atexit) once it printed ``says`` and ``ready`` returned, and
    wait until its rank is found lost: every alert update of ``run_id`` meanwhile."""
    env = {**os.environ, "VIGIL_NATS_URL": url, "VIGIL_HEARTBEAT_INTERVAL": "0.5"}
    with AlertWatch(url) as watch:
        proc = subprocess.Popen(
            [sys.executable, "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == says
            ready(watch)
            assert proc.poll() is None, "alive until killed"
            proc.kill()
            proc.wait()
            wait_for(lambda: [a for a in _updates(watch, run_id) if a.detector == "run_failed"], 60, "lost")
        finally:
            proc.kill()
            proc.communicate()
        return _updates(watch, run_id)


def _updates(watch: AlertWatch, run_id: str) -> list[Anomaly]:
    return [a for _, a in watch.alerts() if a.run_id == run_id]


def _one_episode(daemon: InProcessDaemon, run_id: str) -> dict[str, object]:
    """The run's only row of ``vigil alerts`` (one per episode), with its episode id."""
    listed = daemon.sql(alerts_sql(run_id))
    assert len(listed.rows) == 1, f"one incident, one episode: {listed.rows}"
    row = dict(zip(listed.columns, listed.rows[0], strict=True))
    row["episode"] = daemon.scalar(f"select episode from anomalies where run_id = '{run_id}'")
    return row


def _status(daemon: InProcessDaemon, run_id: str) -> str:
    runs = daemon.sql(RUNS_SQL)
    return next(str(r[runs.columns.index("status")]) for r in runs.rows if r[0] == run_id)


def test_a_killed_process_pages_once_its_stall_page_escalates_to_lost(
    nats_server: NatsServer, liveness_daemon: InProcessDaemon
) -> None:
    def training(watch: AlertWatch) -> None:
        count = "select count(*) from steps where run_id = 'killed'"
        wait_for(lambda: liveness_daemon.scalar(count) >= 20, 30, "the steps")
        assert _updates(watch, "killed") == [], "alive and training"

    got = _killed_until_lost(nats_server.url, KILLED, "killed", "logged", training)
    assert [(a.detector, a.state, a.severity) for a in got] == [
        ("stall", "open", "page"),
        ("run_failed", "escalated", "page"),
    ], got
    stalled, lost = got
    assert stalled.episode == lost.episode, "the stall page escalates: the same episode"
    last = stalled.step
    assert last is not None and last >= 19 and lost.step == last
    assert lost.value is not None and lost.value >= 6 and f"vanished after step {last}" in lost.message
    assert stalled.message in lost.message, "what the page said first stays in it"
    row = _one_episode(liveness_daemon, "killed")
    assert (row["detector"], row["state"], row["severity"], row["step"]) == ("run_failed", "escalated", "page", last)
    assert row["episode"] == lost.episode
    assert _status(liveness_daemon, "killed") == "lost"


def test_a_hung_process_that_then_dies_is_one_episode_escalating_from_hang_to_lost(
    nats_server: NatsServer, liveness_daemon: InProcessDaemon
) -> None:
    def hung(watch: AlertWatch) -> None:
        wait_for(lambda: _updates(watch, "hung"), 60, "the hang page, while its heartbeats come")

    got = _killed_until_lost(nats_server.url, HUNG, "hung", "blocking", hung)
    assert [(a.detector, a.state, a.severity, a.step) for a in got] == [
        ("hang", "open", "page", 39),
        ("stall", "escalated", "page", 39),
        ("run_failed", "escalated", "page", 39),
    ], got
    paged, silent, lost = got
    assert paged.episode == silent.episode == lost.episode, "one incident, one episode"
    assert "heartbeats still arrive" in paged.message
    assert "vanished after step 39" in lost.message and paged.message in lost.message
    row = _one_episode(liveness_daemon, "hung")
    assert (row["detector"], row["state"], row["step"]) == ("run_failed", "escalated", 39)
    assert _status(liveness_daemon, "hung") == "lost"
