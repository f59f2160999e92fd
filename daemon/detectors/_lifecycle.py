"""Which runs are live, so detectors can let go of the rest (pure: batches in, keys out).

A stream (run, rank) is live from its first record until its ``run_end``, or until it has
sent nothing for ``idle_forget_s`` (a run that crashed or was killed never says goodbye), or for
``silent_forget_s`` where that is longer: the detectors that page silence (``stall``, ``hang``, ``run_failed``)
page a stream before it is forgotten.
A run is live while any of its streams is, or while ranks of its ``world_size`` have not been
seen yet: state kept across ranks (``straggler``, ``ckpt_mismatch``) goes once every rank ended
(or the last live one went idle). A run whose first ranks ended before another's records
arrived (an agent that reached the broker late delivers its whole run at once) keeps its
state for those, until they come or ``idle_forget_s`` passes. A ``run_start`` after a
``run_end`` makes the stream live again, and so does any record of a stream that was forgotten: it starts
fresh, as a new stream (its open episodes were dropped with it; their last updates stand in the store).

Time is the daemon's clock (``batch.now``), or in replay, where there is none, the latest
record time seen; it never runs backwards. Idle streams are looked for every quarter of
the horizon, so one is forgotten between 1 and 1.25 horizons after its last record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._series import StreamKey
from trainvigil.daemon.detectors._settings import IDLE_FORGET_MAX_S as IDLE_FORGET_MAX_S
from trainvigil.schemas import Source


@dataclass(slots=True)
class Expired:
    """What detectors may forget after a batch: streams first, then runs."""

    streams: list[StreamKey] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.streams or self.runs)


class RunTracker:
    """Live streams by run, with the clock of each one's latest record."""

    def __init__(self, idle_forget_s: float = 3600.0, silent_forget_s: float | None = None) -> None:
        if not idle_forget_s > 0:
            raise ValueError(f"idle_forget_s must be > 0, not {idle_forget_s!r}")
        self.idle_forget_s = idle_forget_s
        self.silent_forget_s = max(idle_forget_s, silent_forget_s or idle_forget_s)
        """How long a live stream may be silent before it is forgotten: ``idle_forget_s``, or longer while a
        detector that pages silence would page later. A run with no live stream left (its ranks ended,
        others never seen) waits ``idle_forget_s``: nothing watches its silence."""
        self._live: dict[str, dict[int, float]] = {}
        """run → rank → clock of the stream's latest record."""
        self._world: dict[str, int] = {}
        """run → the largest ``world_size`` its records carried."""
        self._ended: dict[str, set[int]] = {}
        """run → its ranks that ended."""
        self._waiting: dict[str, float] = {}
        """Runs with no live stream whose other ranks were never seen: clock when the last one ended."""
        self._clock = Clock()
        self._sweeps = Sweeper(idle_forget_s / 4)

    def __len__(self) -> int:
        """Live runs."""
        return len(self._live)

    def ranks(self, run_id: str) -> list[int]:
        """The live ranks of ``run_id``."""
        return list(self._live.get(run_id, ()))

    def observe(self, batch: IngestBatch) -> Expired:
        """Note the batch's records; the streams and runs that ended with it or went idle."""
        clock = self._clock.advance(batch)
        live = self._live
        sources = [part.source for part in batch.steps]
        for records in (batch.run_starts, batch.events, batch.heartbeats, batch.gil_samples, batch.checkpoints):
            sources.extend(source for source, _ in records)
        world = self._world
        for source in sources:
            ranks = live.get(source.run_id)
            if ranks is None:
                ranks = live[source.run_id] = {}
                self._waiting.pop(source.run_id, None)
            ranks[source.rank] = clock
            if source.world_size > world.get(source.run_id, 1):
                world[source.run_id] = source.world_size
        expired = Expired()
        if batch.run_ends:
            self._end(batch, expired)
        if math.isfinite(clock) and self._sweeps.due(clock):
            self._sweep(clock - self.silent_forget_s, clock - self.idle_forget_s, expired)
        return expired

    def _end(self, batch: IngestBatch, expired: Expired) -> None:
        restarted: dict[StreamKey, float] = {}
        for source, start in batch.run_starts:
            key = (source.run_id, source.rank)
            restarted[key] = max(restarted.get(key, -math.inf), start.time)
        for source, end in batch.run_ends:
            key = (source.run_id, source.rank)
            if restarted.get(key, -math.inf) > end.time:
                continue  # ended, then started again within the batch
            expired.streams.append(key)
            self._drop(source, expired)

    def _drop(self, source: Source, expired: Expired) -> None:
        run_id = source.run_id
        ranks = self._live.get(run_id)
        if ranks is not None:
            ranks.pop(source.rank, None)
        ended = self._ended.setdefault(run_id, set())
        ended.add(source.rank)
        if ranks:
            return
        self._live.pop(run_id, None)
        if len(ended) < self._world.get(run_id, 1):  # ranks not seen yet may still deliver
            self._waiting[run_id] = self._clock.now
            return
        self._forget(run_id, expired)

    def _forget(self, run_id: str, expired: Expired) -> None:
        for table in (self._live, self._world, self._ended, self._waiting):
            table.pop(run_id, None)
        expired.runs.append(run_id)

    def _sweep(self, silent: float, waiting: float, expired: Expired) -> None:
        for run_id, ranks in list(self._live.items()):
            idle = [rank for rank, last in ranks.items() if last < silent]
            for rank in idle:
                del ranks[rank]
                expired.streams.append((run_id, rank))
            if not ranks:
                self._forget(run_id, expired)
        for run_id, since in list(self._waiting.items()):
            if since < waiting:
                self._forget(run_id, expired)


class Clock:
    """The clock silence is measured on: ``batch.now`` live, the latest record time in replay
    (where there is no wall clock); it never runs backwards."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = -math.inf

    def advance(self, batch: IngestBatch) -> float:
        self.now = max(self.now, batch.now if batch.now is not None else latest_time(batch))
        return self.now


class Sweeper:
    """When a sweep over every live stream is due: at most once per ``every`` seconds of a :class:`Clock`."""

    __slots__ = ("_next", "every")

    def __init__(self, every: float) -> None:
        self.every = every
        self._next = -math.inf

    def due(self, now: float) -> bool:
        if now < self._next:
            return False
        self._next = now + self.every
        return True


def latest_time(batch: IngestBatch) -> float:
    """The latest record time in ``batch`` (-inf when it has none)."""
    latest = -math.inf
    for part in batch.steps:
        if len(part):
            latest = max(latest, float(part.times.max()))
    for _, record in batch.sourced_records():
        latest = max(latest, record.time)
    return latest
