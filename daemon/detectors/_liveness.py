"""One liveness state machine per (run, rank): alive → hung → silent → lost, one clock, one sweep, one episode.

Three detectors judge whether a process still lives: ``hang`` (heartbeats come, steps do not), ``stall``
(nothing comes) and ``run_failed`` (nothing came for so long that it is lost, or it ended on an
exception). Each keeping its own clock, a process that died paged once per detector. Here one
:class:`Life` per stream holds the times they all read (the latest record, heartbeat and progress, on
the daemon's clock; the step pace, on the producer's), and the detectors are *stages* of it:

- each stream is in one state, ``alive`` until a stage's condition holds; the sweep (at most once a
  second) puts it in the highest stage whose condition holds, and only ever higher: hung → silent → lost;
- the first stage reached opens the episode, under that stage's detector name; each higher one escalates
  the same episode (same id, state ``escalated``), renamed to that detector, its message saying what it
  said first. A run that ends on an exception escalates the open episode as well (``run_failed``) and
  ends it; with none open it opens one of its own;
- progress (a higher step, in its steps or a heartbeat) or a clean ``run_end`` clears the episode, and so
  does any record of a stream found lost (it was not); the stream is then ``alive`` again.

Severity levels above ``PAGE`` order the stages, so an escalation is the episode machine's own (``_base``):
every update is a page.

The three detectors keep their names, settings and tables (``[detectors.stall]`` ...); in one
:class:`~._runner.Detectors` they share one machine (:func:`link`): the first of them called for a batch
observes and judges it, and each returns the updates that carry its name. Alone (a detector built
outside a ``Detectors``), each runs a machine of its own stages. The machine is one piece of work: a run
it raises on (``_isolation``) is taken from all its stages, not from one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, DetectorSettings, Episodes, Finding
from trainvigil.daemon.detectors._lifecycle import Clock, Sweeper
from trainvigil.daemon.detectors._robust import Window, fast_quantile
from trainvigil.daemon.detectors._series import PAUSE_TAGS, StreamKey, streams
from trainvigil.schemas import Anomaly, RunEnd

ALIVE, HUNG, SILENT, LOST, FAILED = range(5)
"""A stream's states, in the order an episode escalates through them."""

SWEEP_S = 1.0
"""Live streams are swept at most this often (daemon clock)."""

PHASE_TAGS = (*PAUSE_TAGS, "phase")
"""Events that open a declared long phase (ended by the next step)."""

_WINDOW = 512
"""Recent step intervals kept per stream for the p99."""

_MIN_INTERVALS = 8
"""Below this many intervals the pace is unknown (:meth:`Life.p99` is None)."""

_EVER = 2**62
"""A position past any step: the episode clears whatever its cooldown."""


class Life:
    """What is known of one (run, rank) stream's liveness: every stage reads these."""

    __slots__ = (
        "first",
        "heartbeat_at",
        "intervals",
        "last_step",
        "last_time",
        "longest",
        "phase",
        "progress_at",
        "seen",
        "stack",
        "state",
    )

    def __init__(self) -> None:
        self.seen = -math.inf
        """Daemon time of the stream's latest record (any kind)."""
        self.heartbeat_at = -math.inf
        """Daemon time of its latest heartbeat."""
        self.progress_at = math.nan
        """Daemon time its step counter last advanced (or a declared phase began or ended)."""
        self.last_step = -1
        """The highest step seen, in its steps or its heartbeats' ``last_step``."""
        self.last_time = math.nan
        """Producer time of its latest step."""
        self.longest = 0.0
        """Its longest step interval (intervals ending on an announced pause left out)."""
        self.intervals = Window(_WINDOW)
        """Its latest step intervals."""
        self.phase = ""
        """A declared long phase since the last step ("" when none)."""
        self.stack: list[str] = []
        """The training thread's frames from its latest heartbeat that sent some."""
        self.state = ALIVE
        """The highest stage its open episode reached (``ALIVE``: none open)."""
        self.first = ""
        """What the open episode said when it opened (``detector: message``), kept in each escalation."""

    def p99(self) -> float | None:
        """The p99 of its recent step intervals; None while fewer than a few are known."""
        n = self.intervals.count
        return fast_quantile(self.intervals.values, 0.99) if n >= _MIN_INTERVALS else None

    @property
    def step(self) -> int | None:
        """Its last step, None before the first."""
        return self.last_step if self.last_step >= 0 else None


class Stage(Protocol):
    """A state of :class:`Life` that a detector pages on, and when a stream is in it."""

    detector: str
    """The name its updates carry: its detector's."""
    state: int
    """``HUNG``, ``SILENT`` or ``LOST``."""

    @property
    def floor_s(self) -> float:
        """No stream is in this state before its step counter stood still this long (the sweep skips the rest)."""

    def judge(self, key: StreamKey, life: Life, now: float, lives: Mapping[StreamKey, Life]) -> Finding | None:
        """The finding if ``key`` is in this state at ``now`` (``lives``: every stream, for what its run's other
        ranks do), else None."""


SettingsT = TypeVar("SettingsT", bound=DetectorSettings)


class StageOf(Generic[SettingsT]):
    """A stage (or an ending) built from its detector's settings and name."""

    def __init__(self, settings: SettingsT, detector: str) -> None:
        self.settings = settings
        self.detector = detector


class Ending(Protocol):
    """A rank's ``run_end`` that a detector pages on (state ``FAILED``)."""

    detector: str

    def judge(self, rank: int, end: RunEnd) -> Finding | None:
        """The finding if ``end`` is a failure, else None."""


class Liveness:
    """The lives of every stream, the one episode machine they share, and the stages that judge them."""

    def __init__(self, stages: Iterable[Stage] = (), ending: Ending | None = None) -> None:
        self.stages = sorted(stages, key=lambda s: -s.state)
        """Highest state first: the sweep puts a stream in the first whose condition holds."""
        self._floor = min((s.floor_s for s in self.stages), default=math.inf)
        self.ending = ending
        self.lives: dict[StreamKey, Life] = {}
        self.episodes = Episodes("liveness", cooldown=1)
        self._clock = Clock()
        self._sweeps = Sweeper(SWEEP_S)
        self._turn: set[str] = set()
        self._pending: dict[str, list[Anomaly]] = {}

    def updates(self, detector: str, batch: IngestBatch) -> list[Anomaly]:
        """``detector``'s share of the alert updates for ``batch``: those that carry its name.

        The batch is observed and judged once, on the first call of a turn: each detector sharing the
        machine is called once per batch (as ``run_all`` does), so a detector called again starts the next.
        """
        if not self._turn or detector in self._turn:
            self._turn = {detector}  # before judging: a judge that raises has still had its turn
            for anomaly in self._judge(batch):
                self._pending.setdefault(anomaly.detector, []).append(anomaly)
        else:
            self._turn.add(detector)
        return self._pending.pop(detector, [])

    def forget(self, key: StreamKey) -> None:
        """Drop one stream's life and its open episode (its last update stands in the store)."""
        self.lives.pop(key, None)
        self.episodes.forget(key)

    def tracked(self, detector: str) -> int:
        """Streams and open episodes kept (every detector sharing the machine judges them all), and ``detector``'s
        updates waiting to be taken."""
        return len(self.lives) + len(self.episodes) + len(self._pending.get(detector, ()))

    # ---- observing -----------------------------------------------------------------------------------------

    def _life(self, key: StreamKey, now: float, out: list[Anomaly]) -> Life:
        """``key``'s life, which just sent a record: a lost one was not lost after all."""
        life = self.lives.get(key)
        if life is None:
            life = self.lives[key] = Life()
        life.seen = now
        if life.state == LOST:
            self._clear(key, life, _EVER, now, out)
        return life

    def _judge(self, batch: IngestBatch) -> list[Anomaly]:
        now = self._clock.advance(batch)
        out: list[Anomaly] = []
        for key, s in streams(batch).items():
            life = self._life(key, now, out)
            intervals = s.intervals(life.last_time)
            intervals = intervals[np.isfinite(intervals) & (intervals >= 0)]
            if len(intervals):
                life.intervals.push(intervals)
                life.longest = max(life.longest, float(intervals.max()))
            life.last_time = float(s.time[-1])
            self._progress(key, life, int(s.step[-1]), now, out)
        for source, beat in batch.heartbeats:
            key = (source.run_id, source.rank)
            life = self._life(key, now, out)
            life.heartbeat_at = now
            if beat.last_step is not None:
                self._progress(key, life, int(beat.last_step), now, out)
            if beat.stack:
                life.stack = list(beat.stack)
        for records in (batch.run_starts, batch.gil_samples, batch.checkpoints):
            for source, _ in records:
                self._life((source.run_id, source.rank), now, out)
        for source, event in batch.events:
            life = self._life((source.run_id, source.rank), now, out)
            if event.kind in PHASE_TAGS and (event.step is None or event.step >= life.last_step):
                _phase(life, event.kind, event.fields, now)
        for source, end in batch.run_ends:
            self._end((source.run_id, source.rank), end, out)
        if self._sweeps.due(now):  # silence is judged to the second: not on every batch of a busy fleet
            self._sweep(now, out)
        return out

    def _progress(self, key: StreamKey, life: Life, step: int, now: float, out: list[Anomaly]) -> None:
        if math.isnan(life.progress_at):
            life.progress_at = now  # the bound starts with the first record that names a step
        if step <= life.last_step:
            return
        life.last_step, life.progress_at, life.phase, life.stack = step, now, "", []
        if life.state != ALIVE:
            self._clear(key, life, step + 1, now, out)

    def _end(self, key: StreamKey, end: RunEnd, out: list[Anomaly]) -> None:
        """A ``run_end``: the stream is over; a failure pages (escalating what is open), else what is open clears."""
        life = self.lives.pop(key, None) or Life()
        ending = self.ending
        finding = ending.judge(key[1], end) if ending is not None else None
        if ending is None or finding is None:
            if life.state != ALIVE:
                self._clear(key, life, _EVER, end.time, out)
            return
        step = end.last_step if end.last_step is not None else life.step
        at = max(life.last_step, 0) if life.state != ALIVE else (step if step is not None else -1)
        self._escalate(key, life, FAILED, ending.detector, finding, end.time, out, at=at, step=step)
        self.episodes.forget(key)  # the rank is over: nothing will clear it, and a restart may fail again

    # ---- judging --------------------------------------------------------------------------------------------

    def _sweep(self, now: float, out: list[Anomaly]) -> None:
        lives, floor = self.lives, self._floor
        for key, life in lives.items():
            if now - life.progress_at <= floor:
                continue  # stepped lately: in no state (its last record is later still); NaN (no step yet) goes on
            for stage in self.stages:
                if stage.state <= life.state:
                    break  # the episode is there already: stages only escalate
                finding = stage.judge(key, life, now, lives)
                if finding is not None:
                    self._escalate(key, life, stage.state, stage.detector, finding, now, out)
                    break

    def _escalate(
        self,
        key: StreamKey,
        life: Life,
        state: int,
        detector: str,
        finding: Finding,
        now: float,
        out: list[Anomaly],
        *,
        at: int | None = None,
        step: int | None = None,
    ) -> None:
        """Put ``key`` in ``state``: its episode opens there, or escalates keeping what it said first.

        Args:
            at: the episode's position (default: the stream's last step; an escalation keeps the one it opened at).
            step: the step the update names (default: the stream's last step).
        """
        if life.state == ALIVE or not self.episodes.is_open(key):
            life.first = f"{detector}: {finding.message}"
        else:
            said = f"{finding.message}; first paged as {life.first}"
            finding = Finding(finding.value, finding.baseline, finding.threshold, said)
        life.state = state
        position = max(life.last_step, 0) if at is None else at
        named = life.step if step is None else step
        level = PAGE + state - HUNG  # levels above PAGE order the stages: each is an escalation, every one a page
        out.extend(self.episodes.flag(key, position, level, now, finding, step=named, detector=detector))

    def _clear(self, key: StreamKey, life: Life, at: int, now: float, out: list[Anomaly]) -> None:
        out.extend(self.episodes.quiet(key, at, now))
        if not self.episodes.is_open(key):
            life.state, life.first = ALIVE, ""


def _phase(life: Life, kind: str, fields: dict[str, object], now: float) -> None:
    """An announcement opens a phase (``state = "start"``, or an ``eval``/``checkpoint`` event with no
    fields); ``state = "end"`` closes it. An ``eval`` event that reports results (a validation loss)
    tells of an evaluation already over: no phase."""
    mark = fields.get("state")
    if mark == "end":
        life.phase, life.progress_at = "", now  # the loop moved on: the bound starts again
    elif mark == "start" or not fields:
        life.phase, life.progress_at = str(fields.get("name") or kind), now


class LivenessDetector:
    """A detector whose alerts are stages of the liveness machine: settings in ``__init__``, its stages in
    :meth:`stages`; alone it runs a machine of its own, :func:`link` gives several one to share."""

    name: ClassVar[str]
    Settings: ClassVar[type[DetectorSettings]]
    coalesce: ClassVar[bool] = False

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.liveness = Liveness(self.stages(), self.ending())

    def stages(self) -> list[Stage]:
        """The states this detector pages on."""
        return []

    def ending(self) -> Ending | None:
        """The ``run_end`` this detector pages on, if any."""
        return None

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        return self.liveness.updates(self.name, batch)

    def forget(self, key: StreamKey) -> None:
        """Drop a finished or idle stream's life and its open episode (whose last update stands)."""
        self.liveness.forget(key)

    def forget_run(self, run_id: str) -> None:
        """Nothing is kept per run beyond its streams."""

    def tracked(self) -> int:
        return self.liveness.tracked(self.name)


def link(detectors: Iterable[object]) -> None:
    """Give the liveness detectors among ``detectors`` one machine, with all their stages."""
    linked = [d for d in detectors if isinstance(d, LivenessDetector)]
    if len(linked) < 2:
        return
    endings = [e for d in linked if (e := d.ending()) is not None]
    shared = Liveness([s for d in linked for s in d.stages()], endings[0] if endings else None)
    for d in linked:
        d.liveness = shared
