"""The ``vigil`` command line.

Exit codes: each command's are in one table, ``daemon/cli/_exits.py``, which ends every ``--help`` and the
docs' CLI reference.

Every failure is one line on stderr, ``vigil: ...``, saying what to do next; a mistyped flag or value is
refused before anything starts, with the closest valid one.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence

from trainvigil._version import __version__
from trainvigil.daemon.cli import (
    _exits,
    _failures,
    cmd_alerts,
    cmd_auth,
    cmd_bench_optim,
    cmd_canary,
    cmd_checkpoints,
    cmd_demo,
    cmd_export,
    cmd_plot,
    cmd_push,
    cmd_replay,
    cmd_report,
    cmd_runs,
    cmd_shards,
    cmd_sql,
    cmd_up,
    cmd_verify,
)
from trainvigil.daemon.cli._exits import EXIT_OK, EXIT_QUERY, EXIT_TRUNCATED, EXIT_UNAVAILABLE, EXIT_USAGE
from trainvigil.daemon.cli._parser import Parser

__all__ = ["EXIT_OK", "EXIT_QUERY", "EXIT_TRUNCATED", "EXIT_UNAVAILABLE", "EXIT_USAGE", "build_parser", "main"]

COMMANDS = (
    cmd_up,
    cmd_shards,
    cmd_sql,
    cmd_runs,
    cmd_alerts,
    cmd_replay,
    cmd_demo,
    cmd_push,
    cmd_auth,
    cmd_export,
    cmd_verify,
    cmd_checkpoints,
    cmd_canary,
    cmd_report,
    cmd_plot,
    cmd_bench_optim,
)
"""Each command's module, in the order ``vigil --help`` lists them."""
AGENT_ONLY = frozenset({"push", "verify"})
"""Commands that run where training ran: the agent install is enough, the daemon extra is not needed."""
DAEMON_PACKAGES = ("anyio", "duckdb", "structlog")
"""What the daemon extra installs that every other command needs (looked up, not imported: ``vigil sql`` that a
daemon answers never loads DuckDB)."""


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(
        prog="vigil", description="trainvigil: observability for ML training (agents -> NATS -> DuckDB)."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    _exits.add_to_help(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command not in AGENT_ONLY and (
        missing := next((name for name in DAEMON_PACKAGES if importlib.util.find_spec(name) is None), None)
    ):
        print(
            f"vigil: the daemon needs extra packages ({missing}); install them with: pip install 'trainvigil[daemon]'",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    try:
        code: int = args.command_run(args)
    except Exception as exc:
        error = _failures.known(exc)
        if error is None or error.exit_code is None:
            raise
        print(_failures.one_line(error), file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
