"""``run_failed``: a rank ended on an uncaught exception, or vanished without a word.

The agent chains ``sys.excepthook``, so a training script that dies of an exception sends a
``run_end`` with ``status = "error"`` and the exception (``Type: message``) before the
interpreter exits; before, such a run read as ``ok``. That pages at once, once per rank,
naming the exception and the last step.

A process killed without a chance to say so (SIGKILL, the OOM killer, a dead host) sends
nothing more: once a live rank has sent no record at all (no step, no heartbeat) for
``lost_after_s``, well past ``stall``'s horizon, it is *lost*: a page whose ``value`` is the
silence in seconds, and ``vigil runs`` shows the run as ``lost`` while that page is open. The
episode clears if the rank speaks again.

Silence is measured on the daemon's clock (``batch.now``), as ``stall`` does.
"""

from __future__ import annotations

from typing import ClassVar

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, DetectorSettings, Finding, StreamDetector
from trainvigil.daemon.detectors._lifecycle import Clock
from trainvigil.daemon.detectors._series import streams
from trainvigil.schemas import Anomaly

OK_STATUSES = ("ok",)


class RunFailedSettings(DetectorSettings, frozen=True, forbid_unknown_fields=True):
    lost_after_s: float = 600.0
    """A live rank that sent no record at all for this many seconds is lost: a page, and ``vigil runs``
    shows ``lost``."""


class _Stream:
    __slots__ = ("last_step", "lost", "seen")

    def __init__(self) -> None:
        self.seen = float("-inf")
        self.last_step = -1
        self.lost = False


class RunFailed(StreamDetector[_Stream]):
    """Streams are the live ones; a ``run_end`` of any status removes its stream."""

    name: ClassVar[str] = "run_failed"
    Settings: ClassVar[type[DetectorSettings]] = RunFailedSettings

    def __init__(self, settings: RunFailedSettings) -> None:
        super().__init__(settings, cooldown=1)
        self._clock = Clock()

    def new_state(self) -> _Stream:
        return _Stream()

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        now = self._clock.advance(batch)
        out: list[Anomaly] = []
        for key, s in streams(batch).items():
            state = self.state(key)
            state.last_step = max(state.last_step, int(s.step[-1]))
            out.extend(self._alive(key, state, now))
        ending = {id(source) for source, _ in batch.run_ends}  # an envelope's records share its source
        for source, _ in batch.sourced_records():
            if id(source) not in ending:
                key = (source.run_id, source.rank)
                out.extend(self._alive(key, self.state(key), now))
        for source, end in batch.run_ends:
            key = (source.run_id, source.rank)
            self._streams.pop(key, None)
            self.episodes.forget(key)
            if end.status not in OK_STATUSES:
                out.extend(self._failed(key, source.rank, end.status, end.error, end.last_step, end.time))
        for key, state in self._streams.items():
            silent = now - state.seen
            if not state.lost and silent > self.settings.lost_after_s:
                state.lost = True
                step = state.last_step if state.last_step >= 0 else None
                where = f"after step {step}" if step is not None else "before its first step"
                finding = Finding(
                    silent,
                    None,
                    self.settings.lost_after_s,
                    f"rank {key[1]} vanished {where}: no record for {silent:.0f}s and no run_end (lost_after_s "
                    f"{self.settings.lost_after_s:.0f}): killed without a word (SIGKILL, the OOM killer: check "
                    "dmesg) or its host died; the run is marked lost",
                )
                out.extend(self.episodes.flag(key, max(step or 0, 0), PAGE, now, finding, step=step))
        return out

    def _alive(self, key: tuple[str, int], state: _Stream, now: float) -> list[Anomaly]:
        state.seen = now
        if not state.lost:
            return []
        state.lost = False
        return self.episodes.quiet(key, 2**62, now)

    def _failed(
        self, key: tuple[str, int], rank: int, status: str, error: str, last_step: int | None, time: float
    ) -> list[Anomaly]:
        cause = error or "no exception recorded"
        where = f"after step {last_step}" if last_step is not None else "before its first step"
        message = (
            f"rank {rank} ended with status {status!r} {where}: {cause}; the traceback is in that process's stderr"
        )
        out = self.episodes.flag(
            key,
            last_step if last_step is not None else -1,
            PAGE,
            time,
            Finding(None, None, None, message),
            step=last_step,
        )
        self.episodes.forget(key)  # the rank is over: nothing will clear it, and a restart may fail again
        return out
