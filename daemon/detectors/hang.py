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

A hang is the first stage of the rank's one liveness episode (``alive → hung → silent → lost``): if
the process then dies (its heartbeats stop), the same episode escalates to ``stall``, then to
``run_failed`` (lost), each update keeping this message (and its stack), instead of a page per
detector. An episode's row in ``anomalies`` names the stage it last reached.

Time is the daemon's clock (``batch.now``); step intervals come from the producer's clock. A
recording replayed without its heartbeats has none, so this detector stays silent there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from trainvigil.daemon.detectors._base import DetectorSettings, Finding
from trainvigil.daemon.detectors._liveness import HUNG, Life, LivenessDetector, Stage, StageOf
from trainvigil.daemon.detectors._series import StreamKey
from trainvigil.daemon.detectors._settings import HangSettings


class _Hung(StageOf[HangSettings]):
    """The ``hung`` stage: heartbeats come, the step counter does not move."""

    state = HUNG

    @property
    def floor_s(self) -> float:
        return min(self.settings.min_seconds, self.settings.phase_max_s)

    def limit(self, life: Life) -> tuple[float, str]:
        """Seconds without progress that make a hang, and how that bound was reached."""
        s = self.settings
        if life.phase:
            return s.phase_max_s, f"the declared {life.phase} phase may last {s.phase_max_s:.0f}s (phase_max_s)"
        p99 = life.p99()
        if p99 is None or s.factor * p99 < s.min_seconds:
            pace = "" if p99 is None else f"; {s.factor:g} x its p99 step time {p99:.2g}s is less"
            return s.min_seconds, f"min_seconds {s.min_seconds:.0f}s{pace}"
        return s.factor * p99, f"{s.factor:g} x its p99 step time {p99:.2g}s"

    def judge(self, key: StreamKey, life: Life, now: float, lives: Mapping[StreamKey, Life]) -> Finding | None:
        if life.last_step < 0 or now - life.heartbeat_at > self.settings.alive_s:
            return None  # nothing to measure yet, or not alive: that is stall's
        idle = now - life.progress_at
        limit, why = self.limit(life)
        if not idle > limit:
            return None
        return Finding(idle, life.p99(), limit, self._message(key, life, idle, limit, why, now, lives))

    def _message(
        self,
        key: StreamKey,
        life: Life,
        idle: float,
        limit: float,
        why: str,
        now: float,
        lives: Mapping[StreamKey, Life],
    ) -> str:
        run, rank = key
        text = (
            f"rank {rank} has made no progress for {idle:.0f}s (limit {limit:.0f}s: {why}) at step "
            f"{life.last_step} while its heartbeats still arrive: the training loop is blocked inside a live process"
        )
        others = [(r, other) for (rn, r), other in lives.items() if rn == run and r != rank and other.last_step >= 0]
        if others:
            stuck = [r for r, other in others if now - other.progress_at > self.limit(other)[0]]
            steps = [other.last_step for _, other in others]
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
        if life.stack:
            text += "; stuck in " + " <- ".join(reversed(life.stack[-4:]))
        else:
            text += "; see where with py-spy dump --pid PID"
        return text


class Hang(LivenessDetector):
    """Streams are the live ones: a clean ``run_end`` removes its stream at once."""

    name: ClassVar[str] = "hang"
    Settings: ClassVar[type[DetectorSettings]] = HangSettings

    def stages(self) -> list[Stage]:
        return [_Hung(self.settings, self.name)]
