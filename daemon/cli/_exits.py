"""The exit codes of ``vigil``: a code means the same for every command (the table below), and each
command's ``--help`` ends with the codes it returns and when, as does its section here.

This is the one table: the commands return these constants, every ``--help`` ends with its command's
rows (:func:`help_text`), and the docs' CLI reference prints the same rows. A command missing here
fails the parser's build (:func:`codes`), so a new command cannot ship without saying how it exits.
"""

from __future__ import annotations

import argparse

from trainvigil.agents import verify
from trainvigil.daemon.cli._parser import commands
from trainvigil.errors import EXIT_OK, EXIT_PARTIAL, EXIT_QUERY, EXIT_TRUNCATED, EXIT_UNAVAILABLE, EXIT_USAGE

MEANINGS: dict[int, tuple[str, str]] = {
    EXIT_OK: ("EXIT_OK", "success"),
    EXIT_QUERY: ("EXIT_QUERY", "the command ran and failed: a query refused or failed, a file not written or not "
                 "delivered, a canary that did not pass, a checkpoint that differs"),
    EXIT_USAGE: ("EXIT_USAGE", "bad usage or configuration: an unknown flag or value (the error suggests the closest "
                 "one), a value out of range, a malformed URL, a data directory or port that cannot be used"),
    EXIT_UNAVAILABLE: ("EXIT_UNAVAILABLE", "something needed is not there: the daemon's packages (pip install "
                       "'trainvigil[daemon]'), a broker within connect_timeout_s, a daemon or data directory to "
                       "answer"),
    EXIT_TRUNCATED: ("EXIT_TRUNCATED", "an answer was printed, cut short by a row limit or byte budget (stderr says "
                     "which; vigil export gets every row of a run)"),
    EXIT_PARTIAL: ("EXIT_PARTIAL", "an answer across shards was printed without the runs of a shard that did not "
                   "answer (stderr names it)"),
}  # fmt: skip
"""Code → its constant's name and what it means for every command."""

_USAGE = "bad usage: an unknown flag or value, a missing argument"
_PACKAGES = "the daemon's packages are not installed"
_QUERY: dict[int, str] = {
    EXIT_OK: "the answer was printed",
    EXIT_QUERY: "the daemon refused the query, or it failed",
    EXIT_USAGE: "bad usage or configuration (--limit below 1, a malformed --nats, an unusable --config)",
    EXIT_UNAVAILABLE: "no daemon answered and there is no data directory to read (or it cannot be read)",
    EXIT_TRUNCATED: "the answer was printed cut short by the row limit or byte budget (stderr says which)",
    EXIT_PARTIAL: "across shards, the answer lacks the runs of a shard that did not answer (stderr names it)",
}
_SHARDS: dict[int, str] = {EXIT_OK: "printed", EXIT_USAGE: f"{_USAGE} (N out of range)", EXIT_UNAVAILABLE: _PACKAGES}

COMMANDS: dict[str, dict[int, str]] = {
    "vigil up": {
        EXIT_OK: "stopped by SIGTERM/SIGINT after draining, or (--drain) every message of the stream is stored",
        EXIT_USAGE: "bad usage or configuration: a value out of range, a malformed URL, a data directory that cannot "
        "be used or that another daemon holds, a port that another program holds",
        EXIT_UNAVAILABLE: f"no broker answered within connect_timeout_s, no nats-server to start, or {_PACKAGES}",
    },
    "vigil shards": {
        EXIT_OK: "printed",
        EXIT_USAGE: f"{_USAGE} (an action: mappings or which)",
        EXIT_UNAVAILABLE: _PACKAGES,
    },
    "vigil shards mappings": _SHARDS,
    "vigil shards which": _SHARDS,
    "vigil sql": _QUERY,
    "vigil runs": _QUERY,
    "vigil alerts": {**_QUERY, EXIT_OK: "the answer was printed, or --follow was stopped with Ctrl-C"},
    "vigil replay": {
        EXIT_OK: "replayed (the alerts printed, or none raised)",
        EXIT_USAGE: "the recording cannot be read (a missing file, no rows, an unknown --format), or bad usage "
        "or configuration",
        EXIT_UNAVAILABLE: _PACKAGES,
    },
    "vigil demo": {
        EXIT_OK: "the demo ran and printed its answers",
        EXIT_QUERY: "the training script failed",
        EXIT_USAGE: _USAGE,
        EXIT_UNAVAILABLE: f"the bundled nats-server could not be started, or {_PACKAGES}",
    },
    "vigil push": {
        EXIT_OK: "everything was delivered (or there was nothing to push)",
        EXIT_QUERY: "some files were not delivered (they stay)",
        EXIT_USAGE: "the path is wrong or names the spill file of a running agent, or bad usage",
        EXIT_UNAVAILABLE: "no broker answered",
    },
    "vigil auth": {
        EXIT_OK: "the files were written (existing credentials kept)",
        EXIT_USAGE: "bad usage (a malformed --team, --shards out of range) or a directory that cannot be used",
        EXIT_UNAVAILABLE: _PACKAGES,
    },
    "vigil export": {
        EXIT_OK: "every row was written",
        EXIT_QUERY: "a page failed, or the file could not be written (-o FILE is left as it was)",
        EXIT_USAGE: "no such run, or bad usage (parquet without -o)",
        EXIT_UNAVAILABLE: "no daemon answered and there is no data directory to read",
    },
    "vigil verify": {
        verify.EXIT_MATCH: "the content matches the manifest",
        verify.EXIT_MISMATCH: "it does not (the differing tensors are listed), or the file is missing or cannot "
        "be read",
        verify.EXIT_NO_MANIFEST: "there is no manifest beside the file, or bad usage",
        verify.EXIT_NO_TORCH: "torch is not installed (jax and flax, for a file trainvigil.jax.save wrote)",
    },
    "vigil checkpoints": _QUERY,
    "vigil canary": {EXIT_OK: "done", EXIT_USAGE: f"{_USAGE} (an action: run or list)", EXIT_UNAVAILABLE: _PACKAGES},
    "vigil canary run": {
        EXIT_OK: "every canary passed",
        EXIT_QUERY: "one failed, errored or was aborted",
        EXIT_USAGE: "bad usage or configuration: an unknown fault or workload (checked before anything starts), "
        "credentials the broker refused",
        EXIT_UNAVAILABLE: f"the daemon stopped answering, or none could be started, or {_PACKAGES}",
    },
    "vigil canary list": _QUERY,
    "vigil report": {
        EXIT_OK: "the report was printed",
        EXIT_QUERY: "a query failed",
        EXIT_USAGE: "bad usage (--since not a window like 24h)",
        EXIT_UNAVAILABLE: "no daemon answered and there is no data directory to read",
    },
    "vigil plot": {
        EXIT_OK: "the PNG was written",
        EXIT_QUERY: "a query failed",
        EXIT_USAGE: "no such run, or bad usage (--ranks not numbers, --metrics the run did not log)",
        EXIT_UNAVAILABLE: "matplotlib is not installed, or no daemon answered and there is no data directory",
    },
    "vigil bench-optim": {
        EXIT_OK: "every run was trained, judged and stored",
        EXIT_QUERY: "a query to the daemon failed",
        EXIT_USAGE: "bad usage: an optimizer that cannot be built, an unknown workload, a bad --device",
        EXIT_UNAVAILABLE: "no daemon answered and none could be started, or it did not store the results in time",
    },
}
"""Command → the codes it returns, each with what it means there."""


def codes(command: str) -> dict[int, str]:
    """The codes ``command`` (``"vigil canary run"``) returns, in order, with what each means there.

    Raises:
        KeyError: the command is not in :data:`COMMANDS`.
    """
    try:
        return dict(sorted(COMMANDS[command].items()))
    except KeyError:
        raise KeyError(f"{command} has no exit codes in daemon/cli/_exits.py's COMMANDS; add its row") from None


def help_text(command: str) -> str:
    """The ``exit codes:`` block that ends ``command``'s ``--help``, one line per code."""
    return "exit codes:\n" + "\n".join(f"  {code}  {what}" for code, what in codes(command).items())


def overview() -> str:
    """The ``exit codes:`` block of ``vigil --help``: what each code means for every command."""
    return "exit codes:\n" + "\n".join(f"  {code}  {meaning}" for code, (_, meaning) in MEANINGS.items())


def add_to_help(parser: argparse.ArgumentParser) -> None:
    """End the help of ``parser`` (``vigil``) and of each of its commands with the command's exit codes.

    Raises:
        KeyError: a command has no row in :data:`COMMANDS`.
    """
    parser.epilog = overview()
    for name, _, sub in commands(parser):
        sub.epilog = help_text(name)
