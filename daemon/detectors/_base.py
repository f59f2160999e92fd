"""What every detector shares: its signature and the alert-episode state machine.

One incident is one *episode*, not a storm: the first flagged step opens it (one
``Anomaly``, state ``open``), a later flag of a higher severity (a page while it is a warning)
escalates it (state ``escalated``), and once ``cooldown`` steps pass with no flag it clears (state
``cleared``) and the detector re-arms. Every update carries the same ``episode`` id, so the
``anomalies`` table keeps one row per episode.

An episode id names the incident (``detector:run:rank:position``) and ends in a tag keyed by a secret
of the daemon's process (:func:`episode_id`): the same incident judged again in that process (a batch
split and committed in parts, a detector's recovery re-running a run, replays in one ``vigil replay``)
gets the same id, but nobody outside it can name an episode it has not been told about.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._series import StreamKey, Values, streams
from trainvigil.daemon.detectors._settings import DetectorSettings
from trainvigil.schemas import Anomaly

NONE, WARN, PAGE = 0, 1, 2

_EPISODE_KEY = secrets.token_bytes(32)


def episode_id(detector: str, run_id: str, rank: int, at: int) -> str:
    """The id of ``detector``'s episode that opened at position ``at`` of (``run_id``, ``rank``): readable, with a
    tag (HMAC of it under this process's key) that only this process can compute."""
    name = f"{detector}:{run_id}:{rank}:{at}"
    return f"{name}:{hmac.new(_EPISODE_KEY, name.encode(), hashlib.sha256).hexdigest()[:16]}"


class Detector(Protocol):
    """A detector: settings in ``__init__``, work in ``__call__``; state per (run, rank), bounded.

    ``run_all`` tells it when to let go: :meth:`forget` once a stream ended (``run_end``) or
    went idle, :meth:`forget_run` once every stream of a run did.
    """

    name: ClassVar[str]
    Settings: ClassVar[type[DetectorSettings]]
    coalesce: ClassVar[bool]
    """It judges steps only, and its episodes do not depend on how they were batched: while batches
    hold many streams it may get a stream's steps later, several messages at once (``_coalesce``)."""

    def __call__(self, batch: IngestBatch) -> list[Anomaly]: ...

    def forget(self, key: StreamKey) -> None:
        """Drop everything kept about one (run, rank) stream, open episodes included."""

    def forget_run(self, run_id: str) -> None:
        """Drop what is kept about a run across its ranks (its streams were forgotten already)."""

    def tracked(self) -> int:
        """How many streams, runs and open episodes the detector keeps state for."""


@dataclass(frozen=True, slots=True)
class Finding:
    """What a detector says about one flagged position, computed only when an alert goes out."""

    value: float | None
    baseline: float | None
    threshold: float | None
    message: str


@dataclass(slots=True)
class _Episode:
    id: str
    opened_at: int
    last_at: int
    severity: int
    opened_step: int | None
    last_step: int | None
    finding: Finding
    degraded: bool = False
    detector: str = ""
    """The detector its updates name: the episode's latest stage where stages of several share it (``_liveness``)."""


_NO_FINDING = Finding(None, None, None, "")


def _num(x: float | None) -> float | None:
    return None if x is None else float(x)


_journal: ContextVar[list[Anomaly] | None] = ContextVar("trainvigil_detector_journal", default=None)


@contextmanager
def journaled() -> Iterator[list[Anomaly]]:
    """Inside the block, every alert update an :class:`Episodes` emits is also appended to the list yielded.

    A detector that raises half-way through a batch loses the list it was building; the
    journal still holds the updates its episode machines went through, so they are not lost.
    """
    kept: list[Anomaly] = []
    token = _journal.set(kept)
    try:
        yield kept
    finally:
        _journal.reset(token)


class Episodes:
    """Open episodes of one detector, keyed by stream (or any key naming the culprit)."""

    def __init__(
        self, detector: str, cooldown: int, *, unrecovered: Callable[[StreamKey, int], str] | None = None
    ) -> None:
        self.detector = detector
        self.cooldown = cooldown
        self.unrecovered = unrecovered
        """Says why ``key``'s episode may not clear yet at position ``at`` ("" when it may): a detector whose metric
        must be back near its level before the incident. Until then the episode stays open, and
        says so once (state ``degraded``)."""
        self._open: dict[tuple[str, int], _Episode] = {}

    def is_open(self, key: StreamKey) -> bool:
        return key in self._open

    def forget(self, key: StreamKey) -> None:
        """Drop the episode of ``key`` without an update: its last one (in the store) stands."""
        self._open.pop(key, None)

    def forget_run(self, run_id: str) -> None:
        """Drop the episodes of every rank of ``run_id`` (as :meth:`forget`)."""
        for key in [k for k in self._open if k[0] == run_id]:
            del self._open[key]

    def __len__(self) -> int:
        return len(self._open)

    def scan(
        self,
        key: StreamKey,
        at: np.ndarray,
        severity: np.ndarray,
        time: np.ndarray,
        describe: Callable[[int], Finding],
        *,
        steps: bool = True,
    ) -> list[Anomaly]:
        """Walk one stream's positions (ascending ``at``) with their severities (NONE/WARN/PAGE).

        Python work is per flagged position only. ``describe(i)`` explains position ``i``.

        Args:
            steps: ``at`` holds step numbers (reported as the anomaly's step); False for
                positions that are not steps (e.g. GIL sampling periods).
        """
        out: list[Anomaly] = []
        if not len(at):
            return out
        for i in np.flatnonzero(severity).tolist():
            self._maybe_clear(key, int(at[i]) - 1, float(time[i]), out)
            self._flag(key, int(at[i]), int(severity[i]), float(time[i]), describe, i, steps, out)
        self._maybe_clear(key, int(at[-1]), float(time[-1]), out)
        return out

    def flag(
        self,
        key: StreamKey,
        at: int,
        severity: int,
        time: float,
        finding: Finding,
        *,
        step: int | None = None,
        detector: str = "",
    ) -> list[Anomaly]:
        """Flag one position directly (detectors that judge one record at a time).

        Args:
            detector: the name the update carries, when not this machine's: the episode opens under it, and an
                escalation renames it (one episode whose stages are different detectors, ``_liveness``).
        """
        out: list[Anomaly] = []
        self._maybe_clear(key, at - 1, time, out)
        self._flag(key, at, severity, time, lambda _i: finding, 0, step is not None, out, step=step, detector=detector)
        return out

    def quiet(self, key: StreamKey, at: int, time: float) -> list[Anomaly]:
        """Position ``at`` was judged and found clean: clear the episode if its cooldown passed."""
        out: list[Anomaly] = []
        self._maybe_clear(key, at, time, out)
        return out

    def _flag(
        self,
        key: StreamKey,
        at: int,
        severity: int,
        time: float,
        describe: Callable[[int], Finding],
        i: int,
        steps: bool,
        out: list[Anomaly],
        *,
        step: int | None = None,
        detector: str = "",
    ) -> None:
        this_step = step if step is not None else (at if steps else None)
        name = detector or self.detector
        episode = self._open.get(key)
        if episode is not None:
            episode.last_at, episode.last_step = at, this_step
            if severity <= episode.severity:
                return
            episode.severity, episode.detector = severity, name
            state = "escalated"
        else:
            episode = _Episode(
                episode_id(name, key[0], key[1], at), at, at, severity, this_step, this_step, _NO_FINDING, detector=name
            )
            self._open[key] = episode
            state = "open"
        episode.finding = describe(i)
        out.append(self._anomaly(key, episode, state, time, episode.finding))

    def _maybe_clear(self, key: StreamKey, at: int, time: float, out: list[Anomaly]) -> None:
        episode = self._open.get(key)
        if episode is None or at - episode.last_at < self.cooldown:
            return
        why = self.unrecovered(key, at) if self.unrecovered is not None else ""
        if why:
            if not episode.degraded:
                episode.degraded = True
                last = episode.finding
                note = f"[not recovered: {why}] {last.message}"
                out.append(
                    self._anomaly(
                        key, episode, "degraded", time, Finding(last.value, last.baseline, last.threshold, note)
                    )
                )
            return
        del self._open[key]
        since = f"step {episode.last_step}" if episode.last_step is not None else "the last flag"
        # The cleared update keeps the worst flag's numbers and message, so the episode's row still shows them.
        last = episode.finding
        back = "back to its level, " if self.unrecovered is not None else ""
        message = f"[cleared: recovered, {back}no flag for {self.cooldown} positions since {since}] {last.message}"
        out.append(
            self._anomaly(key, episode, "cleared", time, Finding(last.value, last.baseline, last.threshold, message))
        )

    def _anomaly(self, key: StreamKey, episode: _Episode, state: str, time: float, finding: Finding) -> Anomaly:
        anomaly = Anomaly(
            time=time,
            run_id=key[0],
            rank=key[1],
            step=episode.opened_step,
            detector=episode.detector or self.detector,
            severity="page" if episode.severity >= PAGE else "warn",
            value=_num(finding.value),
            baseline=_num(finding.baseline),
            threshold=_num(finding.threshold),
            message=finding.message,
            state=state,
            episode=episode.id,
            last_step=episode.last_step,
        )
        journal = _journal.get()
        if journal is not None:
            journal.append(anomaly)
        return anomaly


class _Watermarked(Protocol):
    watermark: int


StateT = TypeVar("StateT")
MarkedT = TypeVar("MarkedT", bound=_Watermarked)


class StreamDetector(Generic[StateT]):
    """A detector with one state per (run, rank) stream and one episode machine.

    Subclasses set ``name`` and ``Settings`` and build a fresh stream state in
    :meth:`new_state`. Episodes clear after ``cooldown`` positions (default: ``settings.cooldown``).
    """

    name: ClassVar[str]
    Settings: ClassVar[type[DetectorSettings]]
    coalesce: ClassVar[bool] = False

    def __init__(self, settings: Any, cooldown: int | None = None) -> None:
        self.settings = settings
        self.episodes = Episodes(self.name, settings.cooldown if cooldown is None else cooldown)
        self._streams: dict[StreamKey, StateT] = {}

    def new_state(self) -> StateT:
        raise NotImplementedError

    def forget(self, key: StreamKey) -> None:
        """Drop a finished or idle stream's state and its open episode (whose last update stands)."""
        self._streams.pop(key, None)
        self.episodes.forget(key)

    def forget_run(self, run_id: str) -> None:
        """Nothing is kept per run beyond its streams."""

    def tracked(self) -> int:
        return len(self._streams) + len(self.episodes)

    def state(self, key: StreamKey) -> StateT:
        state = self._streams.get(key)
        if state is None:
            state = self._streams[key] = self.new_state()
        return state


class MetricDetector(StreamDetector[MarkedT]):
    """Judges one metric (``settings.metric``) per stream, each step once, in step order.

    The watermark moves once the values are judged, so a batch judged again after ``judge``
    raised raises again on the same stream (which is how ``run_all`` tells whose data it was).
    """

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        out: list[Anomaly] = []
        for key, steps in streams(batch).items():
            state = self.state(key)
            v = steps.metric(self.settings.metric).after(state.watermark)
            if len(v):
                out.extend(self.judge(key, state, v))
                state.watermark = int(v.step[-1])
        return out

    def judge(self, key: StreamKey, state: MarkedT, v: Values) -> list[Anomaly]:
        """The alert updates for the fresh values ``v`` of one stream."""
        raise NotImplementedError
