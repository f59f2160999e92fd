"""``hang``: a live process whose training loop has stopped making progress.

``stall`` pages when a rank goes silent (no step, no heartbeat). A loop blocked inside a live
process (a deadlocked collective, a stuck data loader, a wedged file system) is not silent:
the agent's own thread keeps sending heartbeats every few seconds, each with the same
``last_step``. This detector watches progress, not liveness.

A (run, rank) pages once its step counter has not advanced (no newer step in its ``steps``
records, no higher ``last_step`` in its heartbeats) for longer than
max(``factor`` x the p99 of its recent step intervals, ``min_seconds``) while a heartbeat
arrived within the last ``alive_s`` (without one, the process is frozen or gone: ``stall``).
Why p99 x 20: a healthy loop's slowest steps (data-loader refills, an occasional GC or
allocator pause) stay within a few p99s; 20 leaves room for rare long ones without waiting
minutes on a fast loop, and ``min_seconds`` keeps slow loops (one step a minute) from paging
on a normal step.

Declared long phases do not page: ``with vigil.phase("eval"):`` (a ``phase`` event with
``state`` ``start``/``end``), or a bare ``eval``/``checkpoint`` announcement after the last
step, opens a phase, which may last ``phase_max_s`` before it counts as a hang itself; its end
or a new step closes it. An ``eval`` event that reports results (``val_loss=...``) tells of an
evaluation that is over, so it opens nothing (a real GPT run's loop hung right after one).

The message says where the other ranks of the run are (all stuck at the same step: a
collective or a shared resource; one stuck: that rank) and, when the agent sent one, the
training thread's stack from its latest heartbeat ("stuck in all_reduce").

Time is the daemon's clock (``batch.now``); step intervals come from the producer's clock. In
replay there are no heartbeats, so this detector stays silent there.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, DetectorSettings, Finding, StreamDetector
from trainvigil.daemon.detectors._lifecycle import Clock, Sweeper
from trainvigil.daemon.detectors._robust import Window, fast_quantile
from trainvigil.daemon.detectors._series import PAUSE_TAGS, StreamKey, streams
from trainvigil.schemas import Anomaly

SWEEP_S = 1.0
"""Live streams are swept for silence at most this often (daemon clock)."""

PHASE_TAGS = (*PAUSE_TAGS, "phase")
"""Events that open a declared long phase (ended by the next step)."""

_WINDOW = 512
"""Recent step intervals kept per stream for the p99."""

_MIN_INTERVALS = 8
"""Below this many intervals the pace is unknown and only ``min_seconds`` applies."""


class HangSettings(DetectorSettings, frozen=True, forbid_unknown_fields=True):
    factor: float = 20.0
    """No progress for longer than this x the p99 of recent step intervals pages ..."""
    min_seconds: float = 60.0
    """... and never less than this many seconds."""
    alive_s: float = 30.0
    """Only while a heartbeat came within this many seconds (without one it is ``stall``'s case)."""
    phase_max_s: float = 3600.0
    """How long a declared phase (``vigil.phase(...)``, an ``eval``/``checkpoint`` announcement) may last
    before it counts as a hang."""


class _Stream:
    __slots__ = ("heartbeat_at", "intervals", "last_step", "last_time", "phase", "progress_at", "stack")

    def __init__(self) -> None:
        self.last_step = -1
        self.last_time = float("nan")
        """Producer time of the latest step."""
        self.progress_at = float("nan")
        """Daemon time the step counter last advanced."""
        self.heartbeat_at = float("-inf")
        self.intervals = Window(_WINDOW)
        """The latest step intervals."""
        self.phase = ""
        """A declared long phase since the last step ("" when none)."""
        self.stack: list[str] = []

    def p99(self) -> float | None:
        n = self.intervals.count
        return fast_quantile(self.intervals.values, 0.99) if n >= _MIN_INTERVALS else None


class Hang(StreamDetector[_Stream]):
    """Streams are the live ones: a clean ``run_end`` removes its stream at once."""

    name: ClassVar[str] = "hang"
    Settings: ClassVar[type[DetectorSettings]] = HangSettings

    def __init__(self, settings: HangSettings) -> None:
        super().__init__(settings, cooldown=1)
        self._clock = Clock()
        self._sweeps = Sweeper(SWEEP_S)

    def new_state(self) -> _Stream:
        return _Stream()

    def _progress(self, key: StreamKey, state: _Stream, step: int, now: float) -> list[Anomaly]:
        if step <= state.last_step:
            return []
        state.last_step, state.progress_at, state.phase, state.stack = step, now, "", []
        return self.episodes.quiet(key, step + 1, now)

    @staticmethod
    def _phase(state: _Stream, kind: str, fields: dict[str, object], now: float) -> None:
        """An announcement opens a phase (``state = "start"``, or an ``eval``/``checkpoint`` event with
        no fields); ``state = "end"`` closes it. An ``eval`` event that reports results (a
        validation loss) tells of an evaluation already over: no phase."""
        mark = fields.get("state")
        if mark == "end":
            state.phase, state.progress_at = "", now  # the loop moved on: the bound starts again
        elif mark == "start" or not fields:
            state.phase, state.progress_at = str(fields.get("name") or kind), now

    def limit(self, state: _Stream) -> tuple[float, str]:
        """Seconds without progress that make a hang, and how that bound was reached."""
        s = self.settings
        if state.phase:
            return s.phase_max_s, f"the declared {state.phase} phase may last {s.phase_max_s:.0f}s (phase_max_s)"
        p99 = state.p99()
        if p99 is None or s.factor * p99 < s.min_seconds:
            pace = "" if p99 is None else f"; {s.factor:g} x its p99 step time {p99:.2g}s is less"
            return s.min_seconds, f"min_seconds {s.min_seconds:.0f}s{pace}"
        return s.factor * p99, f"{s.factor:g} x its p99 step time {p99:.2g}s"

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        now = self._clock.advance(batch)
        out: list[Anomaly] = []
        for key, s in streams(batch).items():
            state = self.state(key)
            intervals = s.intervals(state.last_time)
            state.intervals.push(intervals[np.isfinite(intervals) & (intervals >= 0)])
            state.last_time = float(s.time[-1])
            if not np.isfinite(state.progress_at):
                state.progress_at = now
            out.extend(self._progress(key, state, int(s.step[-1]), now))
        for source, beat in batch.heartbeats:
            key = (source.run_id, source.rank)
            state = self.state(key)
            state.heartbeat_at = now
            if not np.isfinite(state.progress_at):
                state.progress_at = now
            if beat.last_step is not None:
                out.extend(self._progress(key, state, int(beat.last_step), now))
            if beat.stack:
                state.stack = list(beat.stack)
        for source, event in batch.events:
            stream = self._streams.get((source.run_id, source.rank))
            if (
                stream is not None
                and event.kind in PHASE_TAGS
                and (event.step is None or event.step >= stream.last_step)
            ):
                self._phase(stream, event.kind, event.fields, now)
        for source, end in batch.run_ends:
            key = (source.run_id, source.rank)
            self._streams.pop(key, None)
            out.extend(self.episodes.quiet(key, 2**62, end.time))
        if not self._sweeps.due(now):  # silence is judged to the second: not on every batch of a busy fleet
            return out
        for key, state in self._streams.items():
            if state.last_step < 0 or now - state.heartbeat_at > self.settings.alive_s:
                continue  # nothing to measure yet, or not alive: that is stall's
            idle = now - state.progress_at
            limit, why = self.limit(state)
            if idle > limit:
                finding = Finding(idle, state.p99(), limit, self._message(key, state, idle, limit, why, now))
                out.extend(self.episodes.flag(key, state.last_step, PAGE, now, finding, step=state.last_step))
        return out

    def _message(self, key: StreamKey, state: _Stream, idle: float, limit: float, why: str, now: float) -> str:
        run, rank = key
        text = (
            f"rank {rank} has made no progress for {idle:.0f}s (limit {limit:.0f}s: {why}) at step "
            f"{state.last_step} while its heartbeats still arrive: the training loop is blocked inside a live process"
        )
        others = [(r, st) for (rn, r), st in self._streams.items() if rn == run and r != rank and st.last_step >= 0]
        if others:
            stuck = [r for r, st in others if now - st.progress_at > self.limit(st)[0]]
            steps = [st.last_step for _, st in others]
            if len(stuck) == len(others):
                text += (
                    f"; all {len(others) + 1} ranks are stuck (steps {min(steps)}-{max(steps)}): "
                    "a collective or a resource they share (NCCL, storage, the data source)"
                )
            else:
                text += (
                    f"; {len(others) - len(stuck)} of {len(others)} other ranks still progress (at steps "
                    f"{min(steps)}-{max(steps)}): this rank is the one stuck (its data loader, its host, its GPU)"
                )
        if state.stack:
            text += "; stuck in " + " <- ".join(reversed(state.stack[-4:]))
        else:
            text += "; see where with py-spy dump --pid PID"
        return text
