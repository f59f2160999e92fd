"""``import trainvigil`` stays light: what a training script pays for importing it."""

from __future__ import annotations

import subprocess
import sys


def test_import_trainvigil_leaves_the_broker_client_for_the_agents_thread() -> None:
    """nats-py (with aiohttp) takes ~120 ms to import: a training script that imports trainvigil, or runs
    with the agent disabled, never loads it; a started agent's thread does, at its first connect."""
    code = (
        "import sys, trainvigil\n"
        "assert 'nats' not in sys.modules, 'imported with trainvigil'\n"
        "agent = trainvigil.init(run_id='imports', enabled=False)\n"
        "agent.log(0, loss=1.0)\n"
        "agent.close()\n"
        "assert 'nats' not in sys.modules, 'imported by a disabled agent'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
