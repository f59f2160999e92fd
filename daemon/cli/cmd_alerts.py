"""``vigil alerts``: list stored alert episodes, or follow updates live on NATS (``--follow``)."""

from __future__ import annotations

import argparse

from trainvigil.daemon.cli._answer import add_query_flags, answer
from trainvigil.daemon.cli._config import reader
from trainvigil.daemon.cli._exits import EXIT_OK

_COLUMNS = "time, run_id, rank, step, detector, severity, state, value, threshold, message"


def alerts_sql(run_id: str | None) -> str:
    """The query behind ``vigil alerts``: one row per episode, oldest first."""
    where = "" if run_id is None else "WHERE run_id = '{}' ".format(run_id.replace("'", "''"))
    return f"SELECT {_COLUMNS} FROM anomalies {where}ORDER BY time, run_id, rank, detector"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    alerts = sub.add_parser(
        "alerts",
        help="list alert episodes, or follow updates live (--follow)",
        description="List alert episodes from the anomalies table (one row per incident), or with --follow "
        "print each update (open, escalated, degraded, cleared) as the daemon publishes it, until Ctrl-C.",
    )
    alerts.add_argument("--run", help="only this run")
    alerts.add_argument("--follow", action="store_true", help="subscribe to vigil.v1.alerts.> and print updates")
    add_query_flags(alerts)
    alerts.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    if not args.follow:
        return answer(args, alerts_sql(args.run))
    from trainvigil.daemon.cli.alerts import follow

    cfg, url, bus = reader(args)
    follow(url, args.run, args.format, access=bus, subjects=cfg.subjects)
    return EXIT_OK
