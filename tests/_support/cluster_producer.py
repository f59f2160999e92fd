"""A training process of several agents for the cluster tests: one agent per ``RUN:RANK[:STEP_TIME]``.

Usage: cluster_producer.py STEPS [--pace SECONDS] [--world N] RUN:RANK[:STEP_TIME] ...

Every agent logs STEPS steps (``loss`` from ``support.expected_loss``, and ``step_time`` when given, so
a slow rank looks slow to the straggler detector), round-robin, ``--pace`` seconds apart per round, then
all close. Exit code 0 only if every agent reports every event delivered. The broker comes from
``VIGIL_NATS_URL`` (a cluster's URLs, comma-separated).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from support import expected_loss

import trainvigil


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("agents", nargs="+", metavar="RUN:RANK[:STEP_TIME]")
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--world", type=int, default=1)
    args = parser.parse_args()
    agents = []
    for spec in args.agents:
        run_id, rank, *step_time = spec.split(":")
        agent = trainvigil.init(run_id=run_id, rank=int(rank), world_size=args.world, flush_interval=0.05)
        agents.append((agent, int(rank), float(step_time[0]) if step_time else None))
    for step in range(args.steps):
        for agent, rank, step_time in agents:
            extra = {"step_time": step_time} if step_time is not None else {}
            agent.log(step, loss=expected_loss(rank, step), lr=1e-3, **extra)
        if args.pace:
            time.sleep(args.pace)
    ok = [agent.close(timeout=60) for agent, _, _ in agents]
    for agent, _, _ in agents:
        print(agent.stats(), file=sys.stderr)
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
