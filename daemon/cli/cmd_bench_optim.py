"""``vigil bench-optim``: optimizers compared on the built-in workloads (``daemon/cli/bench_optim.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainvigil.daemon.cli._config import DAEMON_DATA_DIR_HELP, add_daemon_flags
from trainvigil.daemon.cli.bench_optim import QUICK_SEEDS, QUICK_STEPS, SEEDS, WORKLOAD_NAMES


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench-optim",
        help="benchmark optimizers on the built-in workloads; every run monitored and stored (optim_results)",
        description="Train each optimizer on each workload and seed as a real trainvigil run, and again at a higher "
        "LR that the detectors judge; store one optim_results row per (optimizer, workload, seed), print a table "
        "ranked by final loss and write the loss curves' PNG.",
    )
    p.add_argument("--quick", action="store_true", help=f"short runs ({QUICK_STEPS}) and {QUICK_SEEDS} seeds")
    p.add_argument(
        "--optim",
        action="append",
        metavar="NAME|module:Class",
        help="a built-in (adamw, lion, adan, sophia, muon) or any torch.optim.Optimizer subclass; repeat for "
        "several (default: the five built-ins). AdamW is always run as the baseline",
    )
    p.add_argument("--kw", action="append", default=[], metavar="KEY=VALUE", help="a keyword for the --optim ones")
    p.add_argument("--optim-config", type=Path, help="TOML with [[optim]] tables (target, name, lr, kwargs)")
    p.add_argument("--lr", type=float, help="peak LR for the --optim ones (default: each workload's, scaled)")
    p.add_argument("--workload", action="append", choices=WORKLOAD_NAMES, help="repeat for several (default: all)")
    p.add_argument("--seeds", type=int, help=f"seeds per pair (default {SEEDS}; --quick {QUICK_SEEDS})")
    p.add_argument("--steps", type=int, help="steps of every workload (default: each workload's own)")
    p.add_argument("--unstable-factor", type=float, default=10.0, help="LR multiple of the stability run (10)")
    p.add_argument(
        "--device",
        default="cpu",
        help="where the workloads train: cpu, cuda or cuda:N (peak memory is then CUDA's; rl runs on the CPU only)",
    )
    p.add_argument(
        "--no-trace-memory",
        dest="trace_memory",
        action="store_false",
        help="no peak memory (tracemalloc, which slows every step a little, equally for all optimizers)",
    )
    p.add_argument("--png", default="optim-bench.png", help="loss curves' PNG ('' for none; needs matplotlib)")
    p.add_argument("--format", choices=["table", "json"], default="table", help="the summary (json: every result)")
    add_daemon_flags(
        p,
        data_dir=DAEMON_DATA_DIR_HELP,
        creds="credentials file when the bus has auth (default DATA_DIR/bus/daemon.toml if there)",
    )
    p.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    from trainvigil.daemon.cli import bench_optim

    return bench_optim.run(args)
