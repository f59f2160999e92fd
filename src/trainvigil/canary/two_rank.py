"""``python -m trainvigil.canary.two_rank``: two ranks of the supervised workload, two processes of one run.

Each rank is ``python -m trainvigil.canary.supervised`` with ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``
set and the same ``VIGIL_RUN_ID`` (generated and printed when unset), its own batches and no
collective between them, so that a slow rank shows in its own ``step_time`` rather than in
everyone's (a synchronous all-reduce would make every rank wait for the slowest).

Faults: ``straggler@K`` is armed in the last rank only, where it is that rank's slowdown (each
step from K 1.5x as long, the ``slowdown`` hook); the ``straggler`` detector names that rank.
Every other kind of ``VIGIL_FAULT`` goes to both ranks. A malformed ``VIGIL_FAULT`` stops the
launcher before any rank starts. Flags other than ``--steps`` and ``--seed`` go to each rank
(``--input-wait 0.03``). The exit status is the first failed rank's (128 + N for a rank killed by
signal N), else 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from trainvigil.agents import faults
from trainvigil.agents.options import announce_run_id, default_run_id

from . import WORKLOADS
from ._common import parser

WORLD = 2
SLOW_RANK = WORLD - 1
STEPS = WORKLOADS["two_rank"].steps


def rank_faults(planned: tuple[faults.Fault, ...], rank: int) -> str:
    """``VIGIL_FAULT`` for ``rank``: a straggler only in the slow rank, every other fault in each."""
    return ",".join(str(f) for f in planned if f.kind != "straggler" or rank == SLOW_RANK)


def main(argv: list[str] | None = None) -> None:
    args, rest = parser(__doc__.splitlines()[0].split(": ", 1)[1], steps=STEPS).parse_known_args(argv)
    faults.accept(*WORKLOADS["two_rank"].faults)
    planned = faults.from_env()
    run_id = os.environ.get("VIGIL_RUN_ID", "")
    if not run_id:
        run_id, _ = default_run_id({}, 1)
        announce_run_id(run_id)
    # SIGTERM to the launcher alone (not its process group) still takes the ranks down with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    procs = []
    for rank in range(WORLD):
        env = {**os.environ, "VIGIL_RUN_ID": run_id, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        env.update({"WORLD_SIZE": str(WORLD), faults.ENV: rank_faults(planned, rank)})
        flags = ["--steps", str(args.steps), "--seed", str(args.seed), *rest]
        command = [sys.executable, "-m", WORKLOADS["supervised"].module, *flags]
        procs.append(subprocess.Popen(command, env=env))
    try:
        codes = [proc.wait() for proc in procs]
    finally:  # the launcher interrupted or killed alone: no rank outlives it
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = next((code for code in codes if code), 0)
    sys.exit(128 - failed if failed < 0 else failed)  # a rank killed by signal N: 128 + N, as a shell says


if __name__ == "__main__":
    main()
