"""A batch the store refuses for what it holds is split by message, down to the messages at fault.

The store commits decoded records or refuses them whole (:class:`BatchUnstorableError`); which
message is at fault only the raw messages tell, and decoding is ingest's job. So here a refused
batch is committed in halves, in sequence order, decoded again from its messages, each single
message the store still refuses becoming an ``unstorable`` dead letter committed with its sequence.
Everything else is stored, and the daemon's own alerts and the losses of the batch after it.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from trainvigil.daemon.batch.decode import DeadLetter, IngestBatch, RawMessage, decode_batch
from trainvigil.errors import BatchUnstorableError

log = structlog.get_logger("trainvigil.ingest")


class Writer(Protocol):
    """What is asked of the store (:class:`trainvigil.daemon.store.writer.Store`)."""

    @property
    def last_seq(self) -> int: ...

    def settle(self) -> None: ...

    def write(self, batch: IngestBatch) -> None: ...


def write_isolating(store: Writer, batch: IngestBatch) -> list[DeadLetter]:
    """Write ``batch``; never fails on what a message holds.

    Messages at or below the committed offset are already applied and left out, so calling this
    again with the same batch after a failure stores nothing twice.

    Returns the dead letters made here (``unstorable``, with the database's error). Raises:
        StoreUnavailableError: the database cannot write at all (disk full, I/O error); nothing
            more was committed and the same batch may be retried later.
    """
    store.settle()
    pending = unapplied(batch, store.last_seq)
    try:
        store.write(pending)
        return []
    except BatchUnstorableError as exc:
        log.warning("batch_unstorable", error=exc.detail, messages=len(pending.raw))
    refused: list[DeadLetter] = []
    if len(pending.raw) > 1:
        half = len(pending.raw) // 2
        _isolate(store, pending.raw[:half], refused)
        _isolate(store, pending.raw[half:], refused)
    elif pending.raw:
        _isolate(store, pending.raw, refused)
    tail = IngestBatch(
        anomalies=pending.anomalies[pending.wire_anomalies :],
        losses=pending.losses,
        max_seq=max(store.last_seq, pending.max_seq),
    )
    try:
        store.write(tail)
    except BatchUnstorableError as exc:
        log.error("alerts_unstorable", error=exc.detail, anomalies=len(tail.anomalies))
    return refused


def unapplied(batch: IngestBatch, last_seq: int) -> IngestBatch:
    """``batch`` without the messages at or below ``last_seq``, which an earlier try already committed."""
    if not batch.raw or batch.raw[0].seq > last_seq or batch.reset_offset is not None:
        return batch
    rest = decode_batch([m for m in batch.raw if m.seq > last_seq])
    rest.anomalies.extend(batch.anomalies[batch.wire_anomalies :])
    rest.losses = batch.losses
    rest.max_seq = max(rest.max_seq, batch.max_seq, last_seq)
    rest.now = batch.now
    return rest


def _isolate(store: Writer, msgs: list[RawMessage], refused: list[DeadLetter]) -> None:
    """Commit ``msgs`` in halves, in sequence order, down to the single messages at fault."""
    try:
        store.write(decode_batch(msgs))
        return
    except BatchUnstorableError as exc:
        if len(msgs) > 1:
            half = len(msgs) // 2
            _isolate(store, msgs[:half], refused)
            _isolate(store, msgs[half:], refused)
            return
        error = exc.detail
    m = msgs[0]
    letter = DeadLetter(m.subject, m.seq, "unstorable", error, m.data)
    log.warning("dead_letter", subject=m.subject, seq=m.seq, reason="unstorable", error=error)
    store.write(IngestBatch(dead_letters=[letter], max_seq=m.seq))
    refused.append(letter)
