"""``vigil replay``: run a recording through the daemon's detectors offline, one JSON line per alert update."""

from __future__ import annotations

import argparse
import sys

from trainvigil.daemon.cli._config import add_config
from trainvigil.daemon.cli._exits import EXIT_OK
from trainvigil.daemon.cli.recording_format import FORMATS


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = sub.add_parser(
        "replay",
        help="run recorded metrics through the detectors offline",
        description="Run a recording (columns run_id, rank, step, metrics, optional time in Unix seconds; "
        "empty cell = absent, nan = NaN) through the daemon's detectors and print one JSON line per alert "
        "update. No broker or daemon needed.",
    )
    replay.add_argument("file", help="the recording")
    replay.add_argument("--format", choices=FORMATS, help="default: from the file name")
    add_config(replay, "TOML configuration file (its [detectors.*] tables)")
    replay.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    from trainvigil.daemon import config as config_mod
    from trainvigil.daemon.cli.replay import replay_file

    if not replay_file(args.file, args.format, config_mod.load(args.config), sys.stdout):
        print(f"vigil: no alerts: the detectors raised nothing on {args.file}", file=sys.stderr)
    return EXIT_OK
