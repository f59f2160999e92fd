"""``daemon/cli/cmd_*.py``: one module per command, each light at import, each dispatched by its parser."""

from __future__ import annotations

import argparse
import subprocess
import sys

from trainvigil.daemon.cli import cmd_bench_optim, cmd_canary, cmd_sql
from trainvigil.daemon.cli.main import COMMANDS, build_parser

HEAVY = [
    "duckdb",
    "pyarrow",
    "numpy",
    "nats",
    "aiohttp",
    "anyio",
    "structlog",
    "torch",
    "matplotlib",
    "starlette",
    "uvicorn",
    "trainvigil.agents.agent",
    "trainvigil.agents.transport.worker",
    "trainvigil.daemon.app",
    "trainvigil.daemon.config",
    "trainvigil.daemon.store",
]
"""What building the parser must not load: each is some command's work, imported by its ``run()``."""


def test_building_the_parser_loads_no_commands_work() -> None:
    """``vigil --help`` (and the start of every command) imports the command modules, and none of them loads what
    a command needs only to run."""
    code = (
        "import sys\n"
        "from trainvigil.daemon.cli.main import build_parser\n"
        "build_parser().format_help()\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "trainvigil.daemon.cli.cmd_sql" in loaded
    leaked = [m for m in loaded if any(m == h or m.startswith(f"{h}.") for h in HEAVY)]
    assert not leaked, f"building the parser loaded {leaked}"


def test_every_command_dispatches_to_its_own_module() -> None:
    """Each top-level command of the parser runs the ``run`` of one module of the registry, and each module of
    the registry is one command; a parsed command line carries its module's ``run``."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    runs = {name: command.get_default("command_run") for name, command in sub.choices.items()}
    assert len(runs) == len(COMMANDS)
    assert set(runs.values()) == {module.run for module in COMMANDS}
    assert runs["sql"] is cmd_sql.run and runs["bench-optim"] is cmd_bench_optim.run
    assert parser.parse_args(["canary", "list"]).command_run is cmd_canary.run  # a nested action: its command's
