"""The ``vigil`` commands.

Each command is one module, ``cmd_NAME.py``, with ``add_parser(sub)`` (its flags and help, ending with
``set_defaults(command_run=run)``) and ``run(args) -> int`` (its exit code); ``main.py`` lists them. Building
the parser imports every one of them, so they import only the standard library and light modules at the top:
what a command needs for its work (DuckDB, pyarrow, the daemon, torch) is imported inside its ``run()``, so
``vigil --help`` loads none of it, ``vigil sql`` only the broker client, and the commands that need neither the
daemon extra nor a broker (``verify``, ``push``) run on a training machine. The other modules here are what the
commands share (``_config``: the flags and configuration of a client; ``_answer``: a query's answer printed) and
the work behind them (``sqlclient``, ``export``, ``replay``, ``canary``...).
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
