"""A process that dies of an uncaught exception is a failed run, not a healthy one.

Real processes: nats-server, ``vigil up`` and training scripts that raise; the user's own
``sys.excepthook`` still runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import Daemon, NatsServer, wait_for

from trainvigil.daemon.cli.cmd_runs import RUNS_SQL

SCRIPT = """
import sys, threading, trainvigil
def users_hook(t, e, tb):
    print("users hook ran:", t.__name__, flush=True)
sys.excepthook = users_hook
vigil = trainvigil.init(run_id=sys.argv[1])
threading.Thread(target=lambda: 1 / 0, name="loader").start()
for step in range(30):
    vigil.log(step, loss=1.0)
    if step == 20 and sys.argv[2] == "raise":
        raise ValueError("CUDA error: an illegal memory access was encountered")
"""


def _run_together(url: str, *runs: tuple[str, str]) -> list[subprocess.CompletedProcess[str]]:
    """The script once per ``(run_id, mode)``, side by side (each spends its start-up importing trainvigil)."""
    env = {**os.environ, "VIGIL_NATS_URL": url}
    procs = [
        subprocess.Popen([sys.executable, "-c", SCRIPT, run_id, mode], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for run_id, mode in runs
    ]  # fmt: skip
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
        return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outputs, strict=True)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_an_uncaught_exception_ends_the_run_as_error_pages_run_failed_and_the_users_hook_still_runs(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    daemon = Daemon(nats_server.url, tmp_path / "data")
    daemon.start()
    try:
        crashed, clean = _run_together(nats_server.url, ("crashed", "raise"), ("clean", "finish"))
        assert crashed.returncode == 1
        assert "users hook ran: ValueError" in crashed.stdout, "the user's hook is chained, not replaced"
        assert clean.returncode == 0, clean.stderr
        wait_for(lambda: daemon.scalar("select count(*) from runs where ended_at is not null") == 2, 60, "both ends")
        runs = {row[0]: row for row in daemon.sql(RUNS_SQL).rows}
        columns = daemon.sql(RUNS_SQL).columns
        status = columns.index("status")
        assert runs["crashed"][status] == "error" and runs["clean"][status] == "ok"
        page = daemon.sql("select run_id, step, severity, message from anomalies where detector = 'run_failed'").rows
        assert len(page) == 1, page
        run_id, step, severity, message = page[0]
        assert (run_id, step, severity) == ("crashed", 20, "page")
        assert "ValueError: CUDA error: an illegal memory access" in message
        # A dying thread does not end the run: it is an event, on both runs.
        thread_events = "select count(*) from events where kind = 'thread_exception' and fields like '%ZeroDivision%'"
        assert daemon.scalar(thread_events) == 2
    finally:
        daemon.kill()


KILLED = """
import sys, time, trainvigil
vigil = trainvigil.init(run_id="killed")
for step in range(20):
    vigil.log(step, loss=1.0)
vigil.flush(10)
print("logged", flush=True)
time.sleep(600)
"""


def test_a_process_killed_without_a_word_is_marked_lost_and_pages_run_failed(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    env = {"VIGIL_DETECTORS_RUN_FAILED_LOST_AFTER_S": "3", "VIGIL_DETECTORS_STALL_MIN_SECONDS": "2"}
    daemon = Daemon(nats_server.url, tmp_path / "data", env=env)
    daemon.start()
    agent_env = {**os.environ, "VIGIL_NATS_URL": nats_server.url}
    proc = subprocess.Popen([sys.executable, "-c", KILLED], env=agent_env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "logged"
        wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'killed'") == 20, 30, "the steps")
        proc.kill()  # SIGKILL: no run_end, no atexit
        proc.wait()
        lost = "select step, severity, value, message from anomalies where detector = 'run_failed'"
        step, severity, value, message = wait_for(lambda: daemon.sql(lost).rows, 60, "the lost page")[0]
        assert (step, severity) == (19, "page") and value >= 3 and "vanished after step 19" in message
        runs = daemon.sql(RUNS_SQL)
        status = dict(zip(runs.columns, runs.rows[0], strict=True))["status"]
        assert status == "lost"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        daemon.kill()
