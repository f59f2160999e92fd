"""``run_failed``: a rank ended on an uncaught exception.

The agent chains ``sys.excepthook``, so a training script that dies of an exception sends a
``run_end`` with ``status = "error"`` and the exception (``Type: message``) before the
interpreter exits; before, such a run read as ``ok``. This pages at once, once per rank,
naming the exception and the last step. (A process that vanishes without any ``run_end``:
SIGKILL, the OOM killer, a dead host, is ``stall``'s page.)
"""

from __future__ import annotations

from typing import ClassVar

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, DetectorSettings, Episodes, Finding
from trainvigil.daemon.detectors._series import StreamKey
from trainvigil.schemas import Anomaly

OK_STATUSES = ("ok",)


class RunFailedSettings(DetectorSettings, frozen=True, forbid_unknown_fields=True):
    pass


class RunFailed:
    """Stateless between batches: an ended rank is judged once, on its ``run_end``."""

    name: ClassVar[str] = "run_failed"
    Settings: ClassVar[type[DetectorSettings]] = RunFailedSettings

    def __init__(self, settings: RunFailedSettings) -> None:
        self.settings = settings
        self.episodes = Episodes(self.name, cooldown=1)

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        out: list[Anomaly] = []
        for source, end in batch.run_ends:
            if end.status in OK_STATUSES:
                continue
            key = (source.run_id, source.rank)
            at = end.last_step if end.last_step is not None else -1
            cause = end.error or "no exception recorded"
            where = f"after step {end.last_step}" if end.last_step is not None else "before its first step"
            message = (
                f"rank {source.rank} ended with status {end.status!r} {where}: {cause}; "
                "the traceback is in that process's stderr"
            )
            out.extend(
                self.episodes.flag(key, at, PAGE, end.time, Finding(None, None, None, message), step=end.last_step)
            )
            self.episodes.forget(key)  # the rank is over: nothing will clear it, and a restart may fail again
        return out

    def forget(self, key: StreamKey) -> None:
        self.episodes.forget(key)

    def forget_run(self, run_id: str) -> None:
        self.episodes.forget_run(run_id)

    def tracked(self) -> int:
        return len(self.episodes)
