"""``run_failed``: a rank ended on an uncaught exception, or vanished without a word.

The agent chains ``sys.excepthook``, so a training script that dies of an exception sends a
``run_end`` with ``status = "error"`` and the exception (``Type: message``) before the
interpreter exits; before, such a run read as ``ok``. That pages at once, once per rank,
naming the exception and the last step.

A process killed without a chance to say so (SIGKILL, the OOM killer, a dead host) sends
nothing more: once a live rank has sent no record at all (no step, no heartbeat) for
``lost_after_s``, well past ``stall``'s horizon, it is *lost*: a page whose ``value`` is the
silence in seconds, and ``vigil runs`` shows the run as ``lost`` while that page is open. The
episode clears if the rank speaks again (and, if its steps still do not move, ``hang`` pages anew).

Both are the last stages of the rank's one liveness episode (``alive → hung → silent → lost``, or
an error ``run_end``): a rank already paged by ``stall`` or ``hang`` is not paged again; that
episode escalates to ``run_failed`` (same episode id, state ``escalated``, its row now naming
``run_failed``) and its message keeps what the first page said. A dead process pages once.

Silence is measured on the daemon's clock (``batch.now``), as ``stall`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from trainvigil.daemon.detectors._base import DetectorSettings, Finding
from trainvigil.daemon.detectors._liveness import LOST, Ending, Life, LivenessDetector, Stage, StageOf
from trainvigil.daemon.detectors._series import StreamKey
from trainvigil.daemon.detectors._settings import RunFailedSettings
from trainvigil.schemas import RunEnd

OK_STATUSES = ("ok",)


class _Lost(StageOf[RunFailedSettings]):
    """The ``lost`` stage: no record at all for ``lost_after_s``, and no ``run_end``."""

    state = LOST

    @property
    def floor_s(self) -> float:
        return self.settings.lost_after_s

    def judge(self, key: StreamKey, life: Life, now: float, lives: Mapping[StreamKey, Life]) -> Finding | None:
        silent = now - life.seen
        after = self.settings.lost_after_s
        if not silent > after:
            return None
        where = f"after step {life.last_step}" if life.step is not None else "before its first step"
        return Finding(
            silent,
            None,
            after,
            f"rank {key[1]} vanished {where}: no record for {silent:.0f}s and no run_end (lost_after_s "
            f"{after:.0f}): killed without a word (SIGKILL, the OOM killer: check dmesg) or its host died; "
            "the run is marked lost",
        )


class _Failed(StageOf[RunFailedSettings]):
    """A ``run_end`` whose status is not ``ok``."""

    def judge(self, rank: int, end: RunEnd) -> Finding | None:
        if end.status in OK_STATUSES:
            return None
        cause = end.error or "no exception recorded"
        where = f"after step {end.last_step}" if end.last_step is not None else "before its first step"
        return Finding(
            None,
            None,
            None,
            f"rank {rank} ended with status {end.status!r} {where}: {cause}; the traceback is in that process's stderr",
        )


class RunFailed(LivenessDetector):
    """Streams are the live ones; a ``run_end`` of any status removes its stream."""

    name: ClassVar[str] = "run_failed"
    Settings: ClassVar[type[DetectorSettings]] = RunFailedSettings

    def stages(self) -> list[Stage]:
        return [_Lost(self.settings, self.name)]

    def ending(self) -> Ending | None:
        return _Failed(self.settings, self.name)
