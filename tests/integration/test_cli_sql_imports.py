"""``vigil sql`` that a daemon answers loads only what the answer needs: the broker client (without the websocket
transport's aiohttp) and msgspec; not DuckDB or pyarrow (those read the file when no daemon answers), not the agent,
torch, the daemon's app or its web stack."""

from __future__ import annotations

import subprocess
import sys

from inprocess import InProcessDaemon

UNWANTED = [
    "torch",
    "trainvigil.agents.agent",
    "trainvigil.agents.transport.worker",
    "starlette",
    "uvicorn",
    "aiohttp",
    "duckdb",
    "pyarrow",
    "trainvigil.daemon.app",
    "trainvigil.daemon.store",
    "trainvigil.daemon.shards",
]

_VIGIL_THEN_MODULES = (
    "import sys\n"
    "from trainvigil.daemon.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print('modules:', *sorted(sys.modules), file=sys.stderr)\n"
    "sys.exit(code)\n"
)
"""``vigil ARGS`` as the console script runs it, then every module it loaded, on stderr."""


def _modules(stderr: str) -> list[str]:
    line = next(line for line in stderr.splitlines() if line.startswith("modules: "))
    return line.split()[1:]


def test_vigil_sql_answered_by_the_daemon_loads_no_agent_torch_web_stack_or_duckdb(daemon: InProcessDaemon) -> None:
    command = [sys.executable, "-c", _VIGIL_THEN_MODULES, "sql", "select 40 + 2 AS answer", "--nats", daemon.nats_url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| 42 " in done.stdout, done.stdout
    loaded = _modules(done.stderr)
    assert "nats.aio.client" in loaded and "trainvigil.daemon.cli.sqlclient" in loaded
    leaked = [m for m in loaded if any(m == u or m.startswith(f"{u}.") for u in UNWANTED)]
    assert not leaked, f"vigil sql loaded {leaked}"
