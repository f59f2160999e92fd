"""Hand a :class:`~traces.Trace` to the detectors the way live ingest would.

Steps arrive in chunks of ``chunk`` steps per rank; chunk k of every rank goes in one batch,
before chunk k+1, and ``batch.now`` is the batch's latest step time. Live, the agent flushes
every flush interval (1 s by default), so a pause (a checkpoint, an eval, a stall) is silence on the wire: a chunk ends
before every step interval over ``gap_s`` (30 s: half the stall detector's floor of 60 s), and
idle batches (``steps=[]``) tick every ``tick_s`` through the silence, as the daemon's fetch
loop does when nothing arrives (live it ticks every 0.25 s; 10 s is the resolution here). Heartbeats come every
5 s from every rank except while the run is silent (``Trace.silent``); a batch carries each
rank's latest one (earlier ones in the same batch say nothing more). The last batch carries a
``RunEnd`` per rank, and idle ticks continue for ``linger_s`` after it: a run that ended cleanly
must never look stalled. A checkpoint or eval pause is announced when it starts, as
``agent.event("checkpoint", step=N)`` before a save does: an event on the step before the pause,
in that step's batch (the tag on the step after it says the same thing once it is over).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from traces import HEARTBEAT_S, Trace

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.batch.from_arrays import batch_of, step_columns_of
from trainvigil.schemas import Heartbeat, RunEnd, RunEvent, Source

PAUSE_TAGS = ("checkpoint", "eval")


def segments(wall: np.ndarray, chunk: int, gap_s: float) -> list[tuple[int, int]]:
    """``[start, stop)`` step ranges: at most ``chunk`` long, cut before every gap over ``gap_s``."""
    cuts = np.flatnonzero(np.diff(wall) > gap_s) + 1
    out = []
    for a, b in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(wall)])), strict=True):
        out += [(int(s), int(min(s + chunk, b))) for s in range(int(a), int(b), chunk)]
    return out


class _Heartbeats:
    """Each rank's heartbeat times, handed out as the latest one per rank up to a time."""

    def __init__(self, trace: Trace) -> None:
        wall = trace.ranks[0].time
        beats = np.arange(wall[0], wall[-1], HEARTBEAT_S)
        for lo, hi in trace.silent:
            beats = beats[(beats <= lo) | (beats >= hi)]
        self.beats = beats
        self.wall = wall
        self.sources = [Source(run_id=trace.run_id, rank=r.rank, world_size=len(trace.ranks)) for r in trace.ranks]
        self.sent = 0

    def until(self, now: float) -> list[tuple[Source, Heartbeat]]:
        upto = int(np.searchsorted(self.beats, now, side="right"))
        if upto <= self.sent:
            return []
        self.sent = upto
        t = float(self.beats[upto - 1])
        last = int(np.searchsorted(self.wall, t, side="right")) - 1
        beat = Heartbeat(time=t, last_step=last if last >= 0 else None)
        return [(source, beat) for source in self.sources]


def batches(
    trace: Trace, chunk: int = 256, *, gap_s: float = 30.0, tick_s: float = 10.0, linger_s: float = 900.0
) -> Iterator[IngestBatch]:
    """Every batch the daemon would see for ``trace``, in order."""
    wall = trace.ranks[0].time  # lockstep: every rank's log() times agree to the step
    beats = _Heartbeats(trace)
    parts = segments(wall, chunk, gap_s)
    columns = [(r, r.columns()) for r in trace.ranks]
    now = float(wall[0])
    for i, (a, b) in enumerate(parts):
        tick = now + tick_s
        while tick < wall[a]:  # silence: nothing arrives, the fetch loop times out
            idle = IngestBatch(now=tick)
            idle.heartbeats.extend(beats.until(tick))
            yield idle
            tick += tick_s
        now = float(wall[b - 1])
        batch = batch_of(
            *(
                step_columns_of(
                    trace.run_id, r.rank, r.step[a:b], {k: _cut(c, a, b) for k, c in cols.items()}, r.time[a:b]
                )
                for r, cols in columns
            ),
            now=now,
        )
        batch.heartbeats.extend(beats.until(now))
        batch.events.extend(_announced(trace, a, b))
        if i == len(parts) - 1:
            batch.run_ends.extend((source, RunEnd(time=now, last_step=int(wall.size - 1))) for source in beats.sources)
        yield batch
    end = now
    while now < end + linger_s:
        now += tick_s
        yield IngestBatch(now=now)


def _announced(trace: Trace, a: int, b: int) -> list[tuple[Source, RunEvent]]:
    """Every rank's pause announcements for steps ``[a, b)``: one before each tagged step."""
    out = []
    for r in trace.ranks:
        source = Source(run_id=trace.run_id, rank=r.rank, world_size=len(trace.ranks))
        for tag in PAUSE_TAGS:
            tagged = r.present.get(tag)
            if tagged is None:
                continue
            for p in np.flatnonzero(tagged[a + 1 : b + 1]) + a + 1:
                out.append((source, RunEvent(time=float(r.time[p - 1]), kind=tag, step=int(r.step[p - 1]))))
    return out


Column = np.ndarray | tuple[np.ndarray, np.ndarray]


def _cut(column: Column, a: int, b: int) -> Column:
    if isinstance(column, tuple):
        return column[0][a:b], column[1][a:b]
    return column[a:b]
