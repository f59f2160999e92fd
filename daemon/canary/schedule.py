"""When the schedule ticks and what a tick runs: pure functions of the clock, the config and a random source.

``every`` is an interval (``30m``: ticks at start + 30 min, + 60 min, ...) or a cron expression
(``*/30 * * * *``, read in UTC; croniter does the parsing). Each tick takes the next job in turn
(the configured workloads, then the ``[[canary.jobs]]``) and gives it one fault with probability
``fault_probability``, drawn among the kinds it takes that ``faults`` allows; else it runs clean.
On a shard, a tick's run id is one that shard owns (:func:`owned_id`).
"""

from __future__ import annotations

import math
import random
import secrets
import time
from datetime import UTC, datetime

from trainvigil.daemon.canary.catalog import Job
from trainvigil.daemon.config import CanaryConfig, parse_interval
from trainvigil.schemas.canaries import CLEAN
from trainvigil.schemas.shards import ShardId


class Every:
    """The schedule's ticks (see the module's docstring)."""

    def __init__(self, spec: str, start: float) -> None:
        self.spec = spec
        self.start = start
        self.interval = parse_interval(spec)

    def next_after(self, now: float) -> float:
        """The first tick strictly after ``now`` (Unix seconds)."""
        if self.interval is not None:
            done = max(0, math.floor((now - self.start) / self.interval))
            return self.start + (done + 1) * self.interval
        from croniter import croniter

        nxt: float = croniter(self.spec, datetime.fromtimestamp(now, UTC)).get_next(float)
        return nxt


def scheduled_jobs(config: CanaryConfig, known: dict[str, Job]) -> list[Job]:
    """The jobs ticks take turns with: the configured workloads, then every ``[[canary.jobs]]``."""
    return [known[name] for name in config.workload_names] + [known[j.name] for j in config.jobs]


def draw(job: Job, config: CanaryConfig, rng: random.Random) -> str:
    """The fault of one scheduled canary of ``job``: a kind, or :data:`CLEAN`."""
    kinds = [k for k in job.faults if k in config.fault_kinds]
    if not kinds or rng.random() >= config.fault_probability:
        return CLEAN
    return rng.choice(kinds)


def new_id() -> str:
    """``<UTC time>-<random>``, the id of a canary run (``canary-<id>``): sorts by start, never repeats."""
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def run_id_of(request_id: str) -> str:
    return f"canary-{request_id}"


def owned_id(shard: ShardId | None) -> str:
    """A new id (:func:`new_id`) whose run ``shard`` owns: the broker routes its records to that shard's
    stream, so the shard that runs the canary is the one whose detectors judge it (``None``: any id).

    Ids are drawn until one hashes to ``shard`` (``shard.count`` draws on average): the hash is the
    broker's, so there is no id to compute, only ids to try.
    """
    while True:
        candidate = new_id()
        if shard is None or shard.owns(run_id_of(candidate)):
            return candidate
