"""``vigil canary run|list``: fault-injection canaries on demand (``daemon/cli/canary.py``), and their verdicts."""

from __future__ import annotations

import argparse

from trainvigil.daemon.cli._answer import add_query_flags, answer
from trainvigil.daemon.cli._config import DAEMON_DATA_DIR_HELP, add_daemon_flags
from trainvigil.schemas.canaries import CLEAN, FAULT_KINDS, WORKLOADS

DAEMON_CREDS_HELP = "the daemon's credentials file when the bus has auth (default DATA_DIR/bus/daemon.toml if there)"
LIST_COLUMNS = (
    "time, name AS run_id, workload, fault, verdict, expected_detector, fired_detector, fault_step, fired_step, "
    "latency_steps, round(latency_s, 2) AS latency_s, exit_code, round(duration_s, 1) AS duration_s, detail"
)


def list_sql(last: int) -> str:
    """The query behind ``vigil canary list``."""
    return f"SELECT {LIST_COLUMNS} FROM canary_results ORDER BY time DESC LIMIT {max(1, int(last))}"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    canary = sub.add_parser(
        "canary",
        help="run fault-injection canaries now, or list past verdicts",
        description="Fault-injection canaries: small real training jobs with one fault injected at a known step, "
        "judged on whether the right detector caught it in time (see the docs' canaries guide).",
    )
    actions = canary.add_subparsers(dest="action", required=True, metavar="ACTION")
    run_ = actions.add_parser(
        "run",
        help="run one canary (--fault) or every fault kind and a clean twin (--all), then print the verdicts",
        description="Ask the running daemon to run canaries now and print their progress and verdicts; with no "
        "daemon answering, run one in this process on --data-dir while they last. The fault kind is checked "
        "before anything starts, and a canary the daemon started here would refuse (an unknown workload, a fault "
        "the workload does not take) before it starts.",
    )
    what = run_.add_mutually_exclusive_group(required=True)
    what.add_argument("--fault", metavar="KIND", help=f"one of {', '.join(FAULT_KINDS)}, or {CLEAN}: a clean twin")
    what.add_argument("--all", action="store_true", help="every fault kind once, plus a clean twin")
    run_.add_argument(
        "--workload",
        help=f"a workload ({', '.join(WORKLOADS)}) or a [[canary.jobs]] name; default: the first that takes the "
        "fault (with --all: only this one's faults and its clean twin)",
    )
    run_.add_argument("--steps", type=int, help="--steps for a built-in workload (default: its own)")
    run_.add_argument("--fault-step", type=int, help="the step the fault goes in at (default: the workload's)")
    run_.add_argument("--format", choices=["table", "json"], default="table", help="the verdicts at the end")
    add_daemon_flags(run_, data_dir=DAEMON_DATA_DIR_HELP, creds=DAEMON_CREDS_HELP)
    listing = actions.add_parser(
        "list",
        help="past canaries and their verdicts, newest first",
        description="Past canaries and their verdicts (canary_results), newest first.",
    )
    listing.add_argument("--last", type=int, default=20, help="how many (default 20)")
    add_query_flags(listing)
    canary.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        return answer(args, list_sql(args.last))
    from trainvigil.daemon.cli import canary

    return canary.run(args)
