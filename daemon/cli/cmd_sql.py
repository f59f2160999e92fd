"""``vigil sql``: one read-only query, asked of the running daemon (or read from the data directory's file)."""

from __future__ import annotations

import argparse

from trainvigil.daemon.cli._answer import add_query_flags, answer


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sql = sub.add_parser(
        "sql",
        help="run a read-only SQL query",
        description="Run a read-only SQL query "
        "against the running daemon (over NATS), or the data directory's file if none runs.",
    )
    sql.add_argument("sql", help='the query, e.g. "select run_id, count(*) from steps group by 1"')
    add_query_flags(sql)
    sql.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    return answer(args, args.sql)
