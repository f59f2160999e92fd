"""``vigil report``: the health report over a window (``daemon/cli/report.py``)."""

from __future__ import annotations

import argparse

from trainvigil.daemon.cli._config import DAEMON_DATA_DIR_HELP, add_daemon_flags, reader


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = sub.add_parser(
        "report",
        help="the health report: canaries, detection per fault kind, real runs, alert categories",
        description="The health report over a window: canaries run/passed/failed/errored and the health rate; per "
        "fault kind recall and median and worst latency; per detector the alert episodes on real runs by severity; "
        "real runs total/healthy/degraded/ended with error; alert categories. Asked of the running daemon, else read "
        "from the data directory's file.",
    )
    report.add_argument("--since", default="24h", help="the window, back from now: 30m, 24h, 7d (default 24h)")
    report.add_argument("--format", choices=["table", "json"], default="table", help="how the report is printed")
    add_daemon_flags(report, data_dir=DAEMON_DATA_DIR_HELP)
    report.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    from trainvigil.daemon.cli import report

    return report.run(args, *reader(args))
