"""One detector's bug costs that detector one run, not the daemon and not the other runs' alerts.

A detector that raises on a batch is run again on the batch's runs one at a time (each a
sub-batch, :func:`select_runs`), so the runs it can judge still get their alerts. A run it
raises on is taken from it: logged once (``detector_failed``), counted per detector, its
state in that detector dropped, and the detector sees later batches without that run until
the run ends (or goes idle) or starts again. Alert updates the detector made before it raised
come back from the journal (``_base.journaled``); the rerun skips what it already judged
(detectors keep watermarks), so nothing is reported twice. When the rerun cannot reproduce the
failure (the detector had moved its watermark past the run's data before it raised), the
detector is *suspect*: it gets its next batch run by run, and the run it raises on then is the one.

While no detector has failed nothing here runs: every detector gets the batch as it is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Set
from traceback import TracebackException
from typing import TYPE_CHECKING

import structlog

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.schemas import Anomaly

if TYPE_CHECKING:
    from trainvigil.daemon.detectors._base import Detector
    from trainvigil.daemon.detectors._series import StreamKey

log = structlog.get_logger("trainvigil.detectors")


def runs_in(batch: IngestBatch) -> set[str]:
    """Every run id a record of ``batch`` names."""
    runs = {part.source.run_id for part in batch.steps}
    runs.update(source.run_id for source, _ in batch.sourced_records())
    runs.update(a.run_id for a in batch.anomalies)
    return runs


def select_runs(batch: IngestBatch, runs: Set[str], *, keep: bool = True) -> IngestBatch:
    """The records of ``batch`` that belong to ``runs`` (``keep``), or to every other run (not ``keep``).

    Records of no run (canaries, dead letters, raw messages, losses) and the batch's scalars
    (``now``, ``max_seq``, ``messages``) go along as they are; the new batch has its own lists
    and an empty ``cache``. ``batch`` is not changed.
    """

    def mine(run_id: str) -> bool:
        return (run_id in runs) is keep

    wire = batch.anomalies[: batch.wire_anomalies]
    return IngestBatch(
        steps=[part for part in batch.steps if mine(part.source.run_id)],
        run_starts=[r for r in batch.run_starts if mine(r[0].run_id)],
        run_ends=[r for r in batch.run_ends if mine(r[0].run_id)],
        events=[r for r in batch.events if mine(r[0].run_id)],
        heartbeats=[r for r in batch.heartbeats if mine(r[0].run_id)],
        gil_samples=[r for r in batch.gil_samples if mine(r[0].run_id)],
        checkpoints=[r for r in batch.checkpoints if mine(r[0].run_id)],
        anomalies=[a for a in batch.anomalies if mine(a.run_id)],
        canaries=list(batch.canaries),
        dead_letters=list(batch.dead_letters),
        raw=list(batch.raw),
        losses=list(batch.losses),
        messages=batch.messages,
        wire_anomalies=sum(1 for a in wire if mine(a.run_id)),
        max_seq=batch.max_seq,
        now=batch.now,
    )


class DetectorFailures:
    """Which detectors failed on which runs, and how often each failed."""

    def __init__(self) -> None:
        self.disabled: dict[str, set[str]] = {}
        """Detector name → the runs it is kept from (no entry: none)."""
        self.errors: Counter[str] = Counter()
        """Detector name → its failures: each run taken from it, and each failure no run explains
        (on a batch of no run, or while it was suspect and every run passed alone)."""
        self.suspect: dict[str, TracebackException] = {}
        """Detector name → a failure not pinned on a run yet: its next batch goes to it run by run."""
        self._logged_whole: set[str] = set()

    def __bool__(self) -> bool:
        """Whether any detector is kept from a run or suspect (else every detector gets every batch)."""
        return bool(self.disabled or self.suspect)

    def seen_by(self, name: str, batch: IngestBatch, views: dict[frozenset[str], IngestBatch]) -> IngestBatch:
        """What detector ``name`` may see of ``batch``: all of it, or a view without its disabled runs.

        ``views`` holds the views made for this batch so far (detectors kept from the same runs share one).
        """
        off = self.disabled.get(name)
        if not off:
            return batch
        hidden = frozenset(off & runs_in(batch))
        if not hidden:
            return batch
        view = views.get(hidden)
        if view is None:
            view = views[hidden] = select_runs(batch, hidden, keep=False)
        return view

    def recover(
        self,
        detector: Detector,
        batch: IngestBatch,
        error: Exception,
        journal: list[Anomaly],
        ranks: Callable[[str], Iterable[int]],
    ) -> list[Anomaly]:
        """``detector`` raised ``error`` on ``batch``: its alert updates, run by run; runs it raises on are disabled.

        A failure that no run reproduces alone (the detector had moved past that run's data
        before it raised) makes the detector suspect: see :meth:`run_by_run`.

        Args:
            journal: the updates the detector's episodes made before it raised.
            ranks: the live ranks of a run (their state in the detector is dropped with the run).
        """
        runs = runs_in(batch)
        if not runs:
            self._failed_whole(detector.name, TracebackException.from_exception(error))
            return journal
        rerun, failed = self._by_run(detector, batch, runs, ranks)
        if not failed:
            self.suspect.setdefault(detector.name, TracebackException.from_exception(error))
        kept = [a for a in journal if a.run_id not in failed]
        already = set(kept)
        return kept + [a for a in rerun if a not in already]

    def run_by_run(
        self, detector: Detector, batch: IngestBatch, ranks: Callable[[str], Iterable[int]]
    ) -> list[Anomaly]:
        """A suspect detector's turn: each run of ``batch`` alone, so the next raise names its run.

        It stays suspect through batches of no run; a batch whose runs all pass clears it (and
        the failure is logged once, without a run).
        """
        name = detector.name
        runs = runs_in(batch)
        if not runs:
            try:
                return detector(batch)
            except Exception as exc:
                self._failed_whole(name, TracebackException.from_exception(exc))
                return []
        out, failed = self._by_run(detector, batch, runs, ranks)
        suspected = self.suspect.pop(name)
        if not failed:
            self._failed_whole(name, suspected)
        return out

    def enable(self, runs: Iterable[str]) -> None:
        """Give ``runs`` back to every detector kept from them (they ended, went idle or started again)."""
        back = set(runs)
        for name in list(self.disabled):
            off = self.disabled[name]
            off -= back
            if not off:
                del self.disabled[name]

    def forget(self, detector: Detector, streams: Iterable[StreamKey], runs: Iterable[str]) -> None:
        """Tell ``detector`` to drop ``streams``, then ``runs``; a failure there is one of its failures."""
        try:
            for key in streams:
                detector.forget(key)
            for run_id in runs:
                detector.forget_run(run_id)
        except Exception as exc:
            self._failed_whole(detector.name, TracebackException.from_exception(exc))

    def _by_run(
        self, detector: Detector, batch: IngestBatch, runs: set[str], ranks: Callable[[str], Iterable[int]]
    ) -> tuple[list[Anomaly], set[str]]:
        """``detector`` on each run of ``batch`` alone: the updates (none about a run it raised on) and
        the runs it raised on (now disabled)."""
        out: list[Anomaly] = []
        failed: set[str] = set()
        for run_id in sorted(runs):
            try:
                out.extend(detector(select_runs(batch, {run_id})))
            except Exception as exc:
                failed.add(run_id)
                self._disable(detector, run_id, exc, ranks(run_id))
        if failed:
            out = [a for a in out if a.run_id not in failed]
        return out, failed

    def _disable(self, detector: Detector, run_id: str, error: Exception, ranks: Iterable[int]) -> None:
        name = detector.name
        self.disabled.setdefault(name, set()).add(run_id)
        self.errors[name] += 1
        failure = TracebackException.from_exception(error)
        _log(name, run_id, failure, "the detector skips this run until it ends or starts again")
        # Whatever it holds for the run may be what made it raise.
        self.forget(detector, [(run_id, rank) for rank in ranks], [run_id])

    def _failed_whole(self, name: str, failure: TracebackException) -> None:
        """A failure no single run explains: counted each time, logged the first time."""
        self.errors[name] += 1
        if name not in self._logged_whole:
            self._logged_whole.add(name)
            _log(name, None, failure, "no single run reproduces it; counted each time, logged once")


def _log(name: str, run_id: str | None, failure: TracebackException, action: str) -> None:
    log.error(
        "detector_failed",
        detector=name,
        run_id=run_id,
        error="".join(failure.format_exception_only()).strip(),
        action=action,
        traceback="".join(failure.format()),
    )
