"""What the integration examples share: the with/without arms, and their step times printed last as one JSON line.

Each example marks the end of every framework step with the same small hook, with trainvigil or
``--without`` it, so a comparison of the two runs reads the framework's own step time
(``bench/integrations_overhead.py`` takes the median of the gaps: start-up, evaluation and the odd
stall of a shared machine stay out of it). ``seconds`` is the whole training call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any


def add_arms(parser: argparse.ArgumentParser, run_id: str) -> None:
    """``--run-id``, and the arms a comparison runs: ``--without`` trainvigil, or its agent started ``--init-first``."""
    parser.add_argument("--run-id", default=run_id)
    parser.add_argument("--without", action="store_true", help="train without trainvigil (the baseline)")
    first = "start the agent with trainvigil.init() before training; the integration logs through it"
    parser.add_argument("--init-first", action="store_true", help=first)


def own_agent(args: argparse.Namespace) -> Any:
    """With ``--init-first``, the script's own agent, connected and its run's start acknowledged before
    training (its start-up is not the training's); else ``None`` (the integration starts one itself)."""
    if args.without or not args.init_first:
        return None
    import trainvigil

    agent = trainvigil.init(run_id=args.run_id)
    agent.flush(10)
    return agent


def agent_cpu_s() -> float | None:
    """CPU seconds the agent's thread (``trainvigil-agent``) has used so far; ``None`` when there is none."""
    for thread in threading.enumerate():
        if thread.name == "trainvigil-agent" and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return None


class StepTimes:
    """Perf-counter marks at step ends; :meth:`report` prints their gaps' median and mean, and the CPU the
    agent's thread used between the first mark and the report (it shares the training's cores)."""

    def __init__(self) -> None:
        self.marks: list[float] = []
        self.agent_cpu_from: float | None = None

    def mark(self) -> None:
        if not self.marks:
            self.agent_cpu_from = agent_cpu_s()
        self.marks.append(time.perf_counter())

    def summary(self, seconds: float) -> dict[str, Any]:
        """The gaps' median and mean, and the agent thread's CPU since the first mark (before it is closed)."""
        now = agent_cpu_s()
        agent_cpu = None if now is None or self.agent_cpu_from is None else now - self.agent_cpu_from
        gaps = [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]
        median = statistics.median(gaps) if gaps else float("nan")
        mean = statistics.fmean(gaps) if gaps else float("nan")
        return {"seconds": seconds, "steps": len(gaps), "median_step_ms": 1e3 * median, "mean_step_ms": 1e3 * mean,
                "agent_cpu_s": agent_cpu}  # fmt: skip

    def report(self, seconds: float, agent: Any = None) -> None:
        """Close the script's own agent (an integration closes the one it started), then print the times."""
        summary = self.summary(seconds)
        if agent is not None:
            agent.close()
        print(json.dumps(summary))
