"""The step times of an example's training, printed last as one JSON line.

Each example marks the end of every framework step with the same small hook, with trainvigil or
``--without`` it, so a comparison of the two runs reads the framework's own step time
(``bench/integrations_overhead.py`` takes the median of the gaps: start-up, evaluation and the odd
stall of a shared machine stay out of it). ``seconds`` is the whole training call.
"""

from __future__ import annotations

import json
import statistics
import time


class StepTimes:
    """Perf-counter marks at step ends; :meth:`report` prints their gaps' median and mean."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def mark(self) -> None:
        self.marks.append(time.perf_counter())

    def report(self, seconds: float) -> None:
        gaps = [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]
        median = statistics.median(gaps) if gaps else float("nan")
        mean = statistics.fmean(gaps) if gaps else float("nan")
        print(json.dumps({"seconds": seconds, "steps": len(gaps), "median_step_ms": 1e3 * median,
                          "mean_step_ms": 1e3 * mean}))  # fmt: skip
