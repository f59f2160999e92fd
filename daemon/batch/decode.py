"""Decode fetched messages into one columnar :class:`IngestBatch` (pure: no broker, no DuckDB).

Anything that cannot be read becomes a :class:`DeadLetter` with its reason; one bad
message never spoils the rest of its batch.

Every stream message is an agent's, so a record carries the authority of whoever published it:

- ``forged``: a message holding a record only the daemon writes (:data:`DAEMON_ONLY`: alert updates,
  canary verdicts) is refused whole, and noted in ``IngestBatch.forged`` (ingest pages once per run).
- ``run_mismatch``: the envelope's ``source.run_id`` must be the run whose subject it came on
  (``run_token(run_id)`` is the subject's run token, in ``vigil.v1.<run>.<kind>`` and a shard's
  ``vigil.v1.<P>.<run>.<kind>`` alike, a namespace in front or not), so one run's credentials-holder cannot
  write another's history from its own subject; broker permissions per subject then say who may write which run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from trainvigil.errors import WireError
from trainvigil.schemas import (
    KNOWN_METRICS,
    Anomaly,
    CanaryResult,
    CheckpointDigest,
    Envelope,
    GilSample,
    Heartbeat,
    RunEnd,
    RunEvent,
    RunStart,
    Source,
    StepBatch,
    decode,
)
from trainvigil.schemas.kinds import RECORD_KINDS, SOURCED_FIELDS
from trainvigil.schemas.limits import MAX_TIME, MIN_TIME
from trainvigil.schemas.subjects import run_token

DAEMON_ONLY: tuple[type, ...] = (Anomaly, CanaryResult)
"""Record types only the daemon writes (its detectors, its canary runner: straight into the store,
and out on alert subjects no agent may publish on). One in a stream message is a forgery."""


@dataclass(frozen=True, slots=True)
class RawMessage:
    """What the ingest stage hands over: subject, payload and JetStream stream sequence."""

    subject: str
    data: bytes
    seq: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    subject: str
    seq: int
    reason: str
    error: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Forgery:
    """A message refused for carrying records only the daemon writes: on ``subject``, from ``run_id``
    (the envelope's run when it matches the subject, else the subject's run token), ``kinds`` counted."""

    subject: str
    run_id: str
    kinds: dict[str, int]


@dataclass(slots=True)
class StepColumns:
    """One message's steps as arrays (zero-copy views of the payload where possible)."""

    source: Source
    step: np.ndarray
    times: np.ndarray
    known: dict[str, tuple[np.ndarray, np.ndarray | None]]
    """Known metric name → (float64 values, bool presence mask or None for all present)."""
    custom: dict[str, tuple[np.ndarray, np.ndarray | None]]

    def __len__(self) -> int:
        return len(self.step)


@dataclass(frozen=True, slots=True)
class SeqGap:
    """Stream sequences ``first..last`` that the daemon will never receive (evicted by the
    stream's limits, purged, deleted, or a recreated stream): recorded, never silent."""

    first: int
    last: int
    reason: str

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(slots=True)
class IngestBatch:
    """Everything decoded from one fetch, grouped by destination table."""

    steps: list[StepColumns] = field(default_factory=list)
    run_starts: list[tuple[Source, RunStart]] = field(default_factory=list)
    run_ends: list[tuple[Source, RunEnd]] = field(default_factory=list)
    events: list[tuple[Source, RunEvent]] = field(default_factory=list)
    heartbeats: list[tuple[Source, Heartbeat]] = field(default_factory=list)
    gil_samples: list[tuple[Source, GilSample]] = field(default_factory=list)
    checkpoints: list[tuple[Source, CheckpointDigest]] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    canaries: list[CanaryResult] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    forged: list[Forgery] = field(default_factory=list)
    """The messages among ``dead_letters`` refused as forgeries (reason ``forged``)."""
    raw: list[RawMessage] = field(default_factory=list)
    """The messages this batch was decoded from: a batch the store cannot commit is split by them."""
    losses: list[SeqGap] = field(default_factory=list)
    """Holes in the consumed sequence found while fetching this batch (``data_loss`` rows)."""
    reset_offset: int | None = None
    """The stream was deleted and created again: the committed offset goes back to this (the
    new stream numbers from 1), in the same transaction as the batch."""
    messages: int = 0
    wire_anomalies: int = 0
    """How many of ``anomalies`` (the first ones) came from messages rather than the daemon itself: decoding
    refuses alert records (:data:`DAEMON_ONLY`), so only a caller that builds a batch by hand sets it."""
    max_seq: int = 0
    now: float | None = None
    """Wall-clock time of the batch (live ingest); None in replay, where record times stand in."""
    cache: dict[str, object] = field(default_factory=dict)
    """Views that detectors share, computed once per batch (see ``detectors._series``)."""

    def sourced_records(
        self,
    ) -> Iterator[tuple[Source, RunStart | RunEnd | RunEvent | Heartbeat | GilSample | CheckpointDigest]]:
        """Every (source, record) of the batch that is not a step batch, an anomaly or a canary."""
        for name in SOURCED_FIELDS:
            yield from getattr(self, name)

    @property
    def step_rows(self) -> int:
        return sum(len(s) for s in self.steps)

    @property
    def events_ingested(self) -> int:
        """Agent events this batch carries (a step counts once, however many metrics)."""
        return self.step_rows + sum(len(getattr(self, name)) for name in SOURCED_FIELDS)


def _floats(raw: bytes, n: int, name: str) -> np.ndarray:
    if len(raw) != 8 * n:
        raise WireError(f"column {name!r} holds {len(raw)} bytes, expected {8 * n}", reason="invalid_batch")
    return np.frombuffer(raw, dtype="<f8")


def step_columns(source: Source, batch: StepBatch) -> StepColumns:
    """Check a StepBatch's shape and view its arrays.

    Raises:
        WireError: lengths disagree (``reason="invalid_batch"``).
    """
    if len(batch.step) % 8:
        raise WireError(f"step array of {len(batch.step)} bytes is not int64s", reason="invalid_batch")
    n = len(batch.step) // 8
    step = np.frombuffer(batch.step, dtype="<i8")
    times = _floats(batch.times, n, "times")
    if n and not ((times >= MIN_TIME) & (times <= MAX_TIME)).all():  # False for NaN too
        bad = times[~((times >= MIN_TIME) & (times <= MAX_TIME))][0]
        raise WireError(f"step time {bad!r} is not a Unix time in [{MIN_TIME:g}, {MAX_TIME:g}]", reason="invalid")
    known: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    custom: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for name, column in batch.columns.items():
        values = _floats(column.values, n, name)
        mask = None
        if column.present:
            if len(column.present) != n:
                raise WireError(
                    f"column {name!r} presence mask has {len(column.present)} entries, expected {n}",
                    reason="invalid_batch",
                )
            mask = np.frombuffer(column.present, dtype=np.uint8).astype(bool)
        (known if name in KNOWN_METRICS else custom)[name] = (values, mask)
    return StepColumns(source=source, step=step, times=times, known=known, custom=custom)


def subject_run(subject: str) -> str:
    """The run token of a data subject: ``vigil.v1.<run>.<kind>``, or a shard's ``vigil.v1.<P>.<run>.<kind>``
    (the broker's mapping puts the partition in front), each with a namespace in front or not; "" for
    anything else."""
    parts = subject.split(".")
    return parts[-2] if 4 <= len(parts) <= 6 else ""


def _refuse_forgery(batch: IngestBatch, envelope: Envelope, subject: str, token: str) -> None:
    kinds: dict[str, int] = {}
    for record in envelope.records:
        if isinstance(record, DAEMON_ONLY):
            name = RECORD_KINDS[type(record)].counter
            kinds[name] = kinds.get(name, 0) + 1
    if not kinds:
        return
    run_id = envelope.source.run_id if run_token(envelope.source.run_id) == token else token
    batch.forged.append(Forgery(subject, run_id, kinds))
    said = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    raise WireError(
        f"{subject} carried records only the daemon writes ({said}): agents publish their run's data, never"
        " alerts or canary verdicts; the whole message is refused",
        reason="forged",
    )


def _add_records(batch: IngestBatch, envelope: Envelope, subject: str) -> None:
    source = envelope.source
    token = subject_run(subject)
    _refuse_forgery(batch, envelope, subject, token)  # first: whatever else is wrong, it was an attempt
    if not source.run_id:
        raise WireError("envelope source has an empty run_id", reason="invalid")
    if run_token(source.run_id) != token:
        raise WireError(
            f"an envelope of run {source.run_id!r} came on {subject}, a subject of run token {token!r}: a run's"
            f" records go on subjects of its own run token, {run_token(source.run_id)}, only",
            reason="run_mismatch",
        )
    # Check every step batch before taking anything, so a bad message is dead-lettered whole.
    steps = [step_columns(source, r) for r in envelope.records if isinstance(r, StepBatch)]
    for record in envelope.records:
        if not isinstance(record, StepBatch):  # step batches: the columns above
            getattr(batch, RECORD_KINDS[type(record)].field).append((source, record))
    batch.steps.extend(steps)


def decode_batch(messages: Iterable[RawMessage]) -> IngestBatch:
    """Decode ``messages``; unreadable ones go to ``dead_letters`` with their reason."""
    batch = IngestBatch()
    for msg in messages:
        batch.raw.append(msg)
        batch.messages += 1
        batch.max_seq = max(batch.max_seq, msg.seq)
        try:
            envelope = decode(msg.data)
            _add_records(batch, envelope, msg.subject)
        except WireError as exc:
            batch.dead_letters.append(DeadLetter(msg.subject, msg.seq, exc.reason, str(exc), msg.data))
    return batch
