"""Running a list of detectors over batches: what they see, what they forget, what a failure costs."""

from __future__ import annotations

from collections.abc import Iterable

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import Detector, journaled
from trainvigil.daemon.detectors._coalesce import Coalescer
from trainvigil.daemon.detectors._isolation import DetectorFailures
from trainvigil.daemon.detectors._lifecycle import RunTracker
from trainvigil.daemon.detectors._liveness import link
from trainvigil.daemon.detectors._settings import MIN_STREAMS, STEPS, WAIT_S
from trainvigil.schemas import Anomaly

SILENCE_WATCHERS: dict[str, str] = {"stall": "min_seconds", "hang": "min_seconds", "run_failed": "lost_after_s"}
"""The detectors that page a stream for its silence, and the setting naming the shortest silence each pages.
In one :class:`Detectors` they are stages of one liveness machine (``_liveness``): a rank pages once."""
SILENCE_MARGIN_S = 10.0
"""A stream is forgotten no sooner than this after the longest of those silences: the watchers' own sweeps
(once a second) page it first, and the page stays open in the store with its last update."""


def forget_after_s(detectors: Iterable[Detector], idle_forget_s: float) -> float:
    """How long a silent stream is kept: ``idle_forget_s``, or longer when a silence watcher among
    ``detectors`` pages later (forgetting first would lose its page)."""
    silences = [
        float(getattr(getattr(d, "settings", None), SILENCE_WATCHERS[d.name], 0.0))
        for d in detectors
        if d.name in SILENCE_WATCHERS
    ]
    return max([idle_forget_s, *(silence + SILENCE_MARGIN_S for silence in silences)])


class Detectors(list[Detector]):
    """The detectors a daemon runs, in order, with what :func:`run_all` keeps between batches.

    Attributes:
        runs: the live runs and streams (what detectors may forget, and when): a stream silent for
            ``idle_forget_s`` is forgotten, or later where a silence watcher pages later (:func:`forget_after_s`).
        failures: which detector failed on which run (``errors`` counts them per detector).
        held: the steps held back from the ``coalesce`` detectors while batches are busy.
        forgotten: streams forgotten so far (the ingest hands the freed memory back when it next idles).
    """

    def __init__(
        self,
        detectors: Iterable[Detector] = (),
        *,
        idle_forget_s: float = 3600.0,
        held: Coalescer | None = None,
    ) -> None:
        super().__init__(detectors)
        link(d for d in self if d.name in SILENCE_WATCHERS)
        self.runs = RunTracker(idle_forget_s, forget_after_s(self, idle_forget_s))
        self.forgotten = 0
        self.failures = DetectorFailures()
        self.held = held if held is not None else Coalescer(MIN_STREAMS, STEPS, WAIT_S)

    def tracked(self) -> dict[str, int]:
        """Per detector: how many streams, runs and open episodes it keeps state for."""
        return {d.name: d.tracked() for d in self}


def run_all(detectors: Detectors, batch: IngestBatch) -> list[Anomaly]:
    """Every detector's alert updates for ``batch``, in list order.

    Afterwards the streams that ended with the batch (``run_end``) or went idle are forgotten,
    so a long-lived daemon's memory follows the live runs, not every run it has seen. A
    detector that raises stops neither the batch nor the other detectors: it loses the run it
    raised on until that run ends or starts again (see ``_isolation``).

    Raises:
        TypeError: ``detectors`` is a plain list: use what :func:`build` returns, or wrap the
            list in :class:`Detectors`, which keeps the live runs and the failures between batches.
    """
    if not isinstance(detectors, Detectors):
        raise TypeError(
            f"run_all needs a Detectors (what detectors.build() returns), not {type(detectors).__name__}: "
            "wrap the list as Detectors([...]) and keep it for every batch"
        )
    failures = detectors.failures
    expired = detectors.runs.observe(batch)
    if failures.disabled and batch.run_starts:
        failures.enable({source.run_id for source, _ in batch.run_starts})
    coalesced = detectors.held.view(batch)
    # The views without a detector's disabled runs, made once per (batch, set of runs).
    views: dict[frozenset[str], IngestBatch] = {}
    coalesced_views: dict[frozenset[str], IngestBatch] = {}
    found: list[Anomaly] = []
    ranks = detectors.runs.ranks
    careful = bool(failures)  # only once a detector has failed: the normal path is the plain call below
    with journaled() as journal:
        for detector in detectors:
            seen = coalesced if detector.coalesce else batch
            if careful:
                seen = failures.seen_by(detector.name, seen, coalesced_views if detector.coalesce else views)
                if detector.name in failures.suspect:
                    found.extend(failures.run_by_run(detector, seen, ranks))
                    continue
            mark = len(journal)
            try:
                found.extend(detector(seen))
                continue
            except Exception as exc:
                error = exc
            # Out of the except block, so a failure of the rerun is not chained to this one.
            found.extend(failures.recover(detector, seen, error, journal[mark:], ranks))
    if expired:
        detectors.forgotten += len(expired.streams)
        for detector in detectors:
            failures.forget(detector, expired.streams, expired.runs)
        if failures.disabled:
            failures.enable(expired.runs)
    return found
