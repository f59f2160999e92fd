"""A training process for the tests: logs ``steps`` steps with known values, then closes.

Usage: producer.py RUN_ID RANK STEPS [--pace SECONDS] [--fork CHILD_STEPS]
Exit code 0 only if close() reports every event delivered.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from support import CHILD_OFFSET, expected_loss

import trainvigil


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_id")
    parser.add_argument("rank", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--fork", type=int, default=0, help="steps a forked child logs")
    args = parser.parse_args()
    agent = trainvigil.init(run_id=args.run_id, rank=args.rank, flush_interval=0.05)
    if args.fork:
        pid = os.fork()
        if pid == 0:
            # The child uses the agent it inherited: rebuilt after fork, with its own thread and
            # connection. Its steps are offset so the test can tell them apart.
            for step in range(args.fork):
                agent.log(CHILD_OFFSET + step, loss=expected_loss(args.rank, CHILD_OFFSET + step))
            ok = agent.close(timeout=60)
            print("child", agent.stats(), file=sys.stderr)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            print("forked child did not deliver", file=sys.stderr)
            return 1
    for step in range(args.steps):
        agent.log(
            step,
            loss=expected_loss(args.rank, step),
            lr=1e-3,
            grad_norm=float(step % 97),
            samples=32.0,
            tokens=4096.0,
            my_custom=step * 0.5,
        )
        if args.pace:
            time.sleep(args.pace)
    ok = agent.close(timeout=60)
    print(agent.stats(), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
