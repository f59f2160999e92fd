"""A training loop blocked inside a live process pages ``hang`` with where it is stuck.

Real processes: nats-server, ``vigil up`` and a training script whose loop blocks in a function
for longer than the (test-sized) hang bound while the agent's heartbeats keep arriving.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import Daemon, NatsServer, wait_for

SCRIPT = """
import sys, time, trainvigil
vigil = trainvigil.init(run_id="hung")

def fake_all_reduce():
    sys.stdin.readline()  # blocked until the test has seen the page and lets it go, as peers release a collective

for step in range(40):
    vigil.log(step, loss=1.0 / (step + 1), step_time=0.01)
    time.sleep(0.01)
print("blocking", flush=True)
fake_all_reduce()
for step in range(40, 60):
    vigil.log(step, loss=1.0 / (step + 1), step_time=0.01)
    time.sleep(0.01)
print("closed", vigil.close(timeout=30), flush=True)
"""

ANOMALY = "select state, step, severity, message from anomalies where detector = 'hang' and run_id = 'hung'"


def test_a_loop_blocked_in_a_live_process_pages_hang_with_its_stack_and_clears_when_it_moves(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    env = {"VIGIL_DETECTORS_HANG_MIN_SECONDS": "3", "VIGIL_DETECTORS_HANG_ALIVE_S": "5"}
    daemon = Daemon(nats_server.url, tmp_path / "data", env=env)
    daemon.start()
    agent_env = {**os.environ, "VIGIL_NATS_URL": nats_server.url, "VIGIL_HEARTBEAT_INTERVAL": "0.5"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        env=agent_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        row = wait_for(lambda: daemon.sql(ANOMALY).rows, 60, "the hang page")[0]
        state, step, severity, message = row
        assert (state, step, severity) == ("open", 39, "page"), row
        assert "heartbeats still arrive" in message and "fake_all_reduce" in message, message
        # The loop moves again once let go: the episode clears, and the run ends cleanly.
        assert proc.stdin is not None and proc.poll() is None, "still blocked, alive, when paged"
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        wait_for(lambda: daemon.sql(ANOMALY).rows[0][0] == "cleared", 60, "the hang episode to clear")
        out, err = proc.communicate(timeout=60)
        assert b"closed True" in out, err.decode()[-2000:]
        assert daemon.scalar("select count(*) from anomalies where detector = 'stall' and run_id = 'hung'") == 0
    finally:
        proc.kill()
        proc.communicate()
        daemon.kill()
