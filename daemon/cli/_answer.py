"""The reading commands (``vigil sql``, ``runs``, ``alerts``, ``checkpoints``, ``canary list``): their flags, and one
query's answer printed with what stderr says about it (where it came from, what cut it short, which shards lack).

Nothing heavy loads with this module: the broker client when a query is asked, DuckDB only when the data
directory's file is read or a locked one is explained.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from trainvigil.daemon.cli._config import add_daemon_flags, reader
from trainvigil.daemon.cli._exits import EXIT_OK, EXIT_PARTIAL, EXIT_TRUNCATED, EXIT_USAGE
from trainvigil.daemon.cli._failures import is_duckdb_error, lock_holder
from trainvigil.schemas.redact import redact_url

if TYPE_CHECKING:
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.schemas.query import QueryResult


def add_query_flags(parser: argparse.ArgumentParser) -> None:
    """``--format``, then where the daemon is and ``--limit`` (:func:`~._config.add_daemon_flags`)."""
    parser.add_argument("--format", choices=["table", "csv", "json"], default="table", help="how rows are printed")
    add_daemon_flags(parser, limit=True)


def answer(args: argparse.Namespace, sql: str) -> int:
    """Ask ``sql`` of the daemon (else read the data directory's file) and print the rows as ``--format`` says.

    Returns:
        ``EXIT_OK``; ``EXIT_TRUNCATED`` when a budget cut the answer, ``EXIT_PARTIAL`` when shards lack from it;
        ``EXIT_USAGE`` for ``--limit`` below 1.
    """
    if args.limit is not None and args.limit < 1:
        print(f"vigil: --limit must be at least 1, not {args.limit}", file=sys.stderr)
        return EXIT_USAGE
    from trainvigil.daemon.cli.sqlclient import QuerySource
    from trainvigil.daemon.formatting import render

    cfg, url, bus = reader(args)
    try:
        source = QuerySource(
            nats_url=url, data_dir=cfg.data_dir, timeout=cfg.query_timeout_s + 5, access=bus, subjects=cfg.subjects
        )
        with source:
            result = source.ask(sql, args.limit or cfg.query_row_limit)
            from_daemon = source.from_daemon
    except Exception as exc:
        if not is_duckdb_error(exc):
            raise
        raise unreadable(exc, url, cfg) from exc  # opening the file: a daemon holds it, or it is not a database
    if not from_daemon:  # sqlclient's answer when it read the file itself
        print(f"vigil: no daemon answered at {redact_url(url)}; answered from {source.where}", file=sys.stderr)
    sys.stdout.write(render(result, args.format))
    sys.stdout.flush()
    if source.warning:  # shards missing: said even when a budget also cut the answer
        print(f"vigil: {source.warning}", file=sys.stderr)
    if result.truncated:
        print(truncation(result, args.limit, cfg.query_row_limit), file=sys.stderr)
    return EXIT_PARTIAL if source.warning else EXIT_TRUNCATED if result.truncated else EXIT_OK


def truncation(result: QueryResult, limit: int | None, default_limit: int) -> str:
    """One line saying how much came, which budget cut it, and how to get everything."""
    n = len(result.rows)
    if result.truncated_by == "bytes":
        why = f"the answer's byte budget (query_max_bytes): {result.note}"
    elif result.truncated_by == "rows" and limit == n:
        why = f"--limit {n}"
    elif result.truncated_by == "rows" and n < (limit or default_limit):
        why = f"the daemon's query_row_limit, {n} (a larger --limit is lowered to it)"
    elif result.truncated_by == "rows":
        why = f"the row limit, query_row_limit = {n} (raise it with --limit)"
    else:  # a daemon older than truncated_by
        why = result.note or "a budget of the daemon"
    return (
        f"vigil: truncated: {n} rows returned, cut by {why}; the rest is missing. Every row of a run: "
        "vigil export RUN [--table T] [--format csv|parquet]; else narrow the query (WHERE, LIMIT)"
    )


def unreadable(exc: BaseException, url: str, cfg: DaemonConfig) -> Exception:
    """What it means that no daemon answered and the data directory's file could not be opened (``exc``)."""
    from trainvigil.errors import DaemonUnavailableError

    if holder := lock_holder(exc):
        return DaemonUnavailableError(
            f"no daemon answered at {redact_url(url)}, and {cfg.db_path} is locked by {holder} (a daemon on another "
            "broker?); query through that daemon: --nats URL, or --config with its configuration file"
        )
    return DaemonUnavailableError(f"no daemon answered at {redact_url(url)}, and {cfg.db_path} cannot be read: {exc}")
