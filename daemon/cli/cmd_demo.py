"""``vigil demo``: an embedded broker, a daemon and a short real training loop in a temporary directory, then SQL."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo",
        help="embedded broker + daemon + a short real training loop, then SQL",
        description="Run everything in a temporary directory with a short real training "
        "loop (torch if installed, else numpy) and print a few SQL answers.",
    )
    demo.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    demo.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    demo.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    from trainvigil.daemon.cli.demo import run_demo

    return run_demo(steps=args.steps, keep=args.keep)
