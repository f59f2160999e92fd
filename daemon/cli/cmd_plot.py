"""``vigil plot RUN_ID``: a PNG of a run's curves (``daemon/cli/plot.py``)."""

from __future__ import annotations

import argparse

from trainvigil.daemon.cli._config import DAEMON_DATA_DIR_HELP, add_daemon_flags, reader


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plot = sub.add_parser(
        "plot",
        help="a PNG of a run: one panel per metric, every rank, alert episodes marked",
        description="Draw a run's metrics to a PNG (one panel per metric, a line per rank, alert episodes as bands "
        "coloured by severity, events as dashed lines). Asked of the running daemon, else read from the data "
        "directory's file. Needs matplotlib: pip install 'trainvigil[plot]'.",
    )
    plot.add_argument("run_id", metavar="RUN_ID", help="the run to plot (see `vigil runs`)")
    plot.add_argument("--metrics", help="comma-separated metrics (default: every metric the run logged)")
    plot.add_argument("--ranks", help="comma-separated ranks (default: all)")
    plot.add_argument("-o", "--output", help="the PNG to write (default: RUN_ID.png, made file-name safe)")
    add_daemon_flags(plot, data_dir=DAEMON_DATA_DIR_HELP)
    plot.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    from trainvigil.daemon.cli import plot

    return plot.run(args, *reader(args))
