"""What a failed command says and exits with.

A user-facing error class carries its exit code and the words its line starts with
(:attr:`~trainvigil.errors.VigilError.exit_code`, ``cli_prefix``), so the command line maps any of them the same way
without knowing where it is defined. Errors of the libraries underneath are turned into those where their meaning
is known (a locked DuckDB file: :func:`lock_holder`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

from trainvigil.errors import VigilError
from trainvigil.schemas.terminal import terminal_safe


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, or what it holds when it is a group (a task group wraps what its tasks raise)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def known(exc: BaseException) -> VigilError | None:
    """The first error ``exc`` is or holds that ends a command with its own exit code; ``None``: a bug."""
    return next((e for e in leaves(exc) if isinstance(e, VigilError) and e.exit_code is not None), None)


def one_line(error: VigilError) -> str:
    """The line on stderr for ``error``: one line, always, and safe for a terminal (a query's error may quote a run
    id or metric name)."""
    return "vigil: " + terminal_safe(" ".join(f"{error.cli_prefix}{error}".split()))


def lock_holder(exc: BaseException) -> str | None:
    """Who holds the DuckDB file, when ``exc`` says the file is locked ("process 123"), else ``None``."""
    if "lock" not in str(exc):
        return None
    pid = re.search(r"\(PID (\d+)\)", str(exc))
    return f"process {pid.group(1)}" if pid else "another process"


def is_duckdb_error(exc: BaseException) -> bool:
    """Whether ``exc`` is DuckDB's (a file that cannot be opened, a lock), asked without importing DuckDB: a command
    that a daemon answered over the bus never loads it, and then nothing it raised can be DuckDB's."""
    duckdb = sys.modules.get("duckdb")
    return duckdb is not None and isinstance(exc, duckdb.Error)
