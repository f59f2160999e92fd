"""``stall``: a live run has gone silent.

A (run, rank) that sends no step and no heartbeat for max(``factor`` x its longest step
interval, ``min_seconds``) pages (announced checkpoint/eval pauses do not count as step
intervals: heartbeats cover them); the episode clears as soon as steps resume. A rank that
ended cleanly (``run_end``) never stalls; a new ``run_start`` makes it live again.

A stream silent for longer than ``detectors.idle_forget_s`` is forgotten like every idle
stream (its page stays open in the store with its last update), so that horizon should be
well above the stall limit.

Silence is measured on the daemon's clock (``batch.now``: when records arrived), so clock
skew between hosts does not matter; step intervals come from the producer's own clock. In
replay, where there is no wall clock, the latest record time seen stands in for now.
"""

from __future__ import annotations

from typing import ClassVar

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, DetectorSettings, Finding, StreamDetector
from trainvigil.daemon.detectors._lifecycle import Clock, Sweeper
from trainvigil.daemon.detectors._series import streams
from trainvigil.schemas import Anomaly

SWEEP_S = 1.0
"""Live streams are swept for silence at most this often (daemon clock)."""


class StallSettings(DetectorSettings, frozen=True, forbid_unknown_fields=True):
    factor: float = 5.0
    """Silence longer than this x the rank's longest step interval pages ..."""
    min_seconds: float = 60.0
    """... and never less than this many seconds."""


class _Stream:
    __slots__ = ("last_step", "last_step_time", "longest", "seen")

    def __init__(self) -> None:
        self.seen = 0.0
        """Daemon time of the stream's latest record."""
        self.last_step = -1
        self.last_step_time = float("nan")
        self.longest = 0.0


class Stall(StreamDetector[_Stream]):
    """Streams are the live ones: a clean ``run_end`` removes its stream at once."""

    name: ClassVar[str] = "stall"
    Settings: ClassVar[type[DetectorSettings]] = StallSettings

    def __init__(self, settings: StallSettings) -> None:
        super().__init__(settings, cooldown=1)
        self._clock = Clock()
        self._sweeps = Sweeper(SWEEP_S)

    def new_state(self) -> _Stream:
        return _Stream()

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        now = self._clock.advance(batch)
        out: list[Anomaly] = []
        for source, _ in [*batch.run_starts, *batch.heartbeats]:
            self.state((source.run_id, source.rank)).seen = now
        for key, s in streams(batch).items():
            state = self.state(key)
            state.seen = now
            # The interval ending at each step; those ending on an announced pause do not set the pace.
            intervals = s.intervals(state.last_step_time)
            if len(intervals):
                state.longest = max(state.longest, float(intervals.max()))
            state.last_step_time = float(s.time[-1])
            if int(s.step[-1]) > state.last_step:
                state.last_step = int(s.step[-1])
                out.extend(self.episodes.quiet(key, state.last_step + 1, now))
        for source, end in batch.run_ends:
            key = (source.run_id, source.rank)
            self._streams.pop(key, None)
            out.extend(self.episodes.quiet(key, 2**62, end.time))
        if not self._sweeps.due(now):  # silence is judged to the second: not on every batch of a busy fleet
            return out
        for key, state in self._streams.items():
            limit = max(self.settings.factor * state.longest, self.settings.min_seconds)
            silent = now - state.seen
            if silent > limit:
                finding = Finding(
                    silent,
                    state.longest,
                    limit,
                    f"rank {key[1]} has sent no step or heartbeat for {silent:.0f}s (limit {limit:.0f}s) after step "
                    f"{state.last_step}: the process may be hung (deadlock in a collective, stuck data loader, "
                    "dead host); check it with py-spy dump or the job's logs",
                )
                out.extend(self.episodes.flag(key, state.last_step, PAGE, now, finding, step=state.last_step))
        return out
