"""``stall``: a live run has gone silent.

A (run, rank) that sends no record (no step, no heartbeat) for max(``factor`` x its longest step
interval, ``min_seconds``) pages (announced checkpoint/eval pauses do not count as step
intervals: heartbeats cover them); the episode clears as soon as steps resume. A rank that
ended cleanly (``run_end``) never stalls; a new ``run_start`` makes it live again.

Silence is a stage of the rank's one liveness episode (``alive → hung → silent → lost``): a rank
already paged by ``hang`` (its heartbeats came, its steps did not) that then goes silent too escalates
that episode to ``stall`` instead of opening a second page, and a silent rank that stays silent for
``run_failed``'s ``lost_after_s`` escalates it on to ``run_failed`` (lost). An episode's row in
``anomalies`` names the stage it last reached; its message keeps what it said first.

A stream silent for longer than ``detectors.idle_forget_s`` is forgotten like every idle
stream (its page stays open in the store with its last update), so that horizon should be
well above the stall limit.

Silence is measured on the daemon's clock (``batch.now``: when records arrived), so clock
skew between hosts does not matter; step intervals come from the producer's own clock. In
replay, where there is no wall clock, the latest record time seen stands in for now.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from trainvigil.daemon.detectors._base import DetectorSettings, Finding
from trainvigil.daemon.detectors._liveness import SILENT, Life, LivenessDetector, Stage, StageOf
from trainvigil.daemon.detectors._series import StreamKey
from trainvigil.daemon.detectors._settings import StallSettings


class _Silent(StageOf[StallSettings]):
    """The ``silent`` stage: nothing at all came for longer than the rank's own pace allows."""

    state = SILENT

    @property
    def floor_s(self) -> float:
        return self.settings.min_seconds

    def judge(self, key: StreamKey, life: Life, now: float, lives: Mapping[StreamKey, Life]) -> Finding | None:
        limit = max(self.settings.factor * life.longest, self.settings.min_seconds)
        silent = now - life.seen
        if not silent > limit:
            return None
        return Finding(
            silent,
            life.longest,
            limit,
            f"rank {key[1]} has sent no step or heartbeat for {silent:.0f}s (limit {limit:.0f}s) after step "
            f"{life.last_step}: the process may be hung (deadlock in a collective, stuck data loader, "
            "dead host); check it with py-spy dump or the job's logs",
        )


class Stall(LivenessDetector):
    """Streams are the live ones: a clean ``run_end`` removes its stream at once."""

    name: ClassVar[str] = "stall"
    Settings: ClassVar[type[DetectorSettings]] = StallSettings

    def stages(self) -> list[Stage]:
        return [_Silent(self.settings, self.name)]
