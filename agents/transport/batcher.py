"""What ``log()`` and ``publish()`` appended, turned into encoded messages: pure, no broker, no thread.

:meth:`Batcher.pack` moves the step buffer into an open batch in chunks of :data:`CHUNK` entries
and yields after each one, so its caller (the worker) can give the GIL back to the training thread
between chunks. Packing early is what keeps ``log()``'s tail short: the metric dicts of the
training thread are freed within a few hundred calls, so their memory is reused instead of taken
fresh (fresh pages cost the training thread microseconds). A batch is sealed (encoded, cut to the
broker's payload limit) once it holds ``batch_size`` rows, or by :meth:`Batcher.seal` at a flush.
Records (events, heartbeats, digests) go out grouped by subject.

Every message gets a ``Nats-Msg-Id`` fixed here, so every resend carries the same one (JetStream
drops duplicates). What cannot be packed or encoded is dropped and counted by reason, never raised.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable, Iterator

from trainvigil.schemas import Envelope, Record, Source, StepBatch, encode
from trainvigil.schemas.kinds import RECORD_KINDS
from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, Kind, Subjects

from .._drops import Drops
from .._values import MetricNames, describe
from ..spill.outbox import OutMsg
from .columnar import Entry, StepBatchBuilder, split_step_batch

CHUNK = 256
"""Entries packed per slice of worker time: well under 1 ms of GIL per slice."""
MAX_PAYLOAD = 768 * 1024
"""Below nats-server's default 1 MiB max_payload, with room for headers."""

Failed = Callable[[str, BaseException, str, int], None]
"""Told of an unexpected exception: (what was being done, the exception, drop reason, events lost)."""


class Batcher:
    """Packs entries and records into :class:`OutMsg` on ``subjects``' data subjects of the run; ``drops`` counts
    what it leaves out."""

    def __init__(
        self, source: Source, batch_size: int, drops: Drops, failed: Failed, subjects: Subjects = DEFAULT_SUBJECTS
    ) -> None:
        self.source = source
        self.subjects = subjects
        self.batch_size = batch_size
        self.drops = drops
        self._failed = failed
        self._seq = 0
        # Unpredictable message ids (no other client can shadow one); a batcher made after fork draws its own.
        self.nonce = secrets.token_hex(8)
        self._id_prefix = f"{source.run_id}/{source.rank}/{source.host}/{source.pid}/{self.nonce}"
        self._open = StepBatchBuilder()
        self.names = MetricNames()
        """The metric names packed so far (the worker says which look like typos of known ones)."""

    @property
    def open_rows(self) -> int:
        """Rows packed into the batch not sealed yet."""
        return self._open.rows

    def pack(self, steps: deque[Entry]) -> Iterator[list[OutMsg]]:
        """Move what ``steps`` holds now (later appends wait for the next call) into the open batch,
        one :data:`CHUNK` per step of the iteration, yielding the messages of every batch that
        reached ``batch_size`` rows on the way (usually none)."""
        remaining = len(steps)
        while remaining:
            take = min(remaining, CHUNK, self.batch_size - self._open.rows)
            self._add([steps.popleft() for _ in range(take)])
            remaining -= take
            yield self.seal() if self._open.rows >= self.batch_size else []

    def seal(self) -> list[OutMsg]:
        """The open batch as messages (none when it is empty); the next rows start a new one."""
        builder, self._open = self._open, StepBatchBuilder()
        self.drops.merge(builder.dropped, builder.notes)
        try:
            batch = builder.finish(time.time())
            if batch is None:
                return []
            self.names.add(batch.columns)
            return self._step_messages(batch)
        except Exception as exc:
            self._failed("packing or encoding steps", exc, "encode_error", builder.rows)
            return []

    def records(self, records: deque[Record]) -> list[OutMsg]:
        """Every record ``records`` holds, as messages grouped by subject."""
        by_kind: dict[Kind, list[Record]] = {}
        while records:
            record = records.popleft()
            record_kind = RECORD_KINDS.get(type(record))
            by_kind.setdefault(record_kind.subject if record_kind is not None else "run", []).append(record)
        out: list[OutMsg] = []
        for subject_kind, group in by_kind.items():
            self._group(self.subjects.data(self.source.run_id, subject_kind), group, out)
        return out

    def _add(self, chunk: list[Entry]) -> None:
        """Add ``chunk`` to the open batch; if that fails, entry by entry, so only the culprits are lost."""
        builder = self._open
        try:
            builder.add(chunk)
            return
        except Exception as exc:
            self._failed("packing steps", exc, "", 0)
        for entry in chunk:
            try:
                builder.add([entry])
            except Exception:
                self.drops.add("build_error", note=f"the log() call for step {describe(entry[0])}")

    def _step_messages(self, batch: StepBatch) -> list[OutMsg]:
        """One message for ``batch``, or several when it is larger than the broker takes."""
        payload = self._encode([batch])
        rows = len(batch.step) // 8
        if len(payload) <= MAX_PAYLOAD:
            return [self._message(self.subjects.data(self.source.run_id, "metrics"), payload, rows)]
        if rows == 1:
            step = int.from_bytes(batch.step, "little", signed=True)
            self.drops.add("too_large", note=f"step {step} with {len(batch.columns)} metrics")
            return []
        parts = split_step_batch(batch, min(rows, len(payload) // MAX_PAYLOAD + 1))
        return [msg for part in parts for msg in self._step_messages(part)]

    def _group(self, subject: str, group: list[Record], out: list[OutMsg]) -> None:
        """One message for ``group``; halves when it cannot be encoded or is too large, down to
        the single record at fault, which is dropped and named."""
        try:
            payload = self._encode(group)
        except Exception as exc:
            if len(group) == 1:
                self._failed("encoding a record", exc, "", 0)
                self.drops.add("encode_error", note=_name(group[0]))
                return
            payload = b""
        if payload and len(payload) <= MAX_PAYLOAD:
            out.append(self._message(subject, payload, len(group)))
        elif len(group) > 1:
            half = len(group) // 2
            self._group(subject, group[:half], out)
            self._group(subject, group[half:], out)
        else:
            self.drops.add("too_large", note=f"{_name(group[0])} encodes to {len(payload)} bytes")

    def _encode(self, records: list[Record]) -> bytes:
        self._seq += 1
        return encode(Envelope(source=self.source, seq=self._seq, records=records))

    def _message(self, subject: str, payload: bytes, events: int) -> OutMsg:
        return OutMsg(subject, f"{self._id_prefix}/{self._seq}", payload, events)


def _name(record: Record) -> str:
    """How a dropped record is named in the log: an event by its kind, and the step where there is one."""
    kind = getattr(record, "kind", None)
    step = getattr(record, "step", None)
    name = type(record).__name__ if kind is None else f"event {kind!r}"
    return name if step is None else f"{name} at step {step}"
