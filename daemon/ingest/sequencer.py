"""Stream order for the ingest: which delivered messages to apply, and what a gap means (pure).

JetStream numbers every message of a stream (the *stream sequence*). A pull consumer does not
deliver them strictly in that order: a message lost in flight (the connection cut as a slow
consumer, a broker restart), or fetched by someone else on the same durable, stays
ack-pending and comes back after ``ack_wait``, *behind* newer ones. Skipping everything at or
below the highest committed sequence then loses it for good, with an ack.

The rule here: the daemon keeps ``next_seq``, the next sequence it needs, and applies only a
contiguous run that starts there.

* ``seq < next_seq``: already handed to the writer (a redelivery); ack it, never apply it again.
* ``seq == next_seq``: apply it, ``next_seq += 1``.
* ``seq > next_seq``: a gap. The run before it is applied; the rest is held (neither applied nor
  acked). The stream then says whether ``next_seq..seq-1`` still exist (:func:`judge`): if one
  does, the consumer is recreated at it (*rewind*) and delivers in order again; if none does,
  they were evicted by the stream's limits, purged or deleted, and become a :class:`SeqGap`
  (a ``data_loss`` row, a log line, a counter) before ``next_seq`` moves past them.

Why nothing is lost or stored twice: every batch is committed with ``next_seq - 1`` as its
offset, in one transaction with its rows and its losses, and batches commit in order. So the
committed offset ``L`` always means: every sequence ``<= L`` is stored, dead-lettered or a
recorded loss, and nothing above ``L`` is stored. A restart (a SIGKILL at any point) recreates
the consumer at ``L + 1``; a sequence is applied only when it equals ``next_seq``, which then
moves past it, so it is never applied twice; and ``next_seq`` only moves past a sequence by
applying it or by recording it lost, so none is skipped in silence. Acks carry no durability
here (the offset does), so acking a redelivery early is safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from trainvigil.daemon.batch.decode import SeqGap

EVICTED = "evicted"
"""Below the stream's first sequence: dropped by its age or size limits, or purged."""
DELETED = "deleted"
"""Inside the stream's range but gone: deleted one by one."""
RECREATED = "stream_recreated"
"""The stream was deleted and created again: what the old one still held is unknowable."""


@dataclass(slots=True)
class Admission:
    """What to do with one delivery; positions index the delivered list."""

    take: list[int] = field(default_factory=list)
    """Apply these, in this order (stream order, contiguous from the old ``next_seq``)."""
    stale: list[int] = field(default_factory=list)
    """Taken before (redeliveries): ack, do not apply."""
    held: list[int] = field(default_factory=list)
    """Past a gap, in stream order: neither apply nor ack (a rewind delivers them again)."""
    gap: int | None = None
    """The first sequence delivered past the gap; None when there is none."""


class Sequencer:
    """``next_seq`` and the rule above; a few integer comparisons per message."""

    def __init__(self, next_seq: int) -> None:
        self.next_seq = next_seq

    def admit(self, seqs: Sequence[int], positions: Sequence[int] | None = None) -> Admission:
        """Sort ``seqs`` (stream sequences of one delivery) into take / stale / held.

        ``positions`` limits the work to those indexes of ``seqs`` (the held part of an earlier
        admission, after its gap turned out to be a loss).
        """
        order = sorted(range(len(seqs)) if positions is None else positions, key=seqs.__getitem__)
        out = Admission()
        expect = self.next_seq
        for k, i in enumerate(order):
            seq = seqs[i]
            if seq == expect:
                out.take.append(i)
                expect += 1
            elif seq < expect:
                out.stale.append(i)
            else:
                out.gap = seq
                out.held = order[k:]
                break
        self.next_seq = expect
        return out

    def skip(self, losses: Sequence[SeqGap]) -> None:
        """Move past sequences recorded as lost (they must start at ``next_seq``)."""
        for gap in losses:
            assert gap.first == self.next_seq, (gap, self.next_seq)
            self.next_seq = gap.last + 1


@dataclass(frozen=True, slots=True)
class StreamView:
    """What the stream says about ``next_seq`` onwards (from stream info and one message lookup)."""

    first_seq: int
    last_seq: int
    existing: int | None
    """The lowest sequence >= ``next_seq`` the stream still holds; None: none."""


@dataclass(frozen=True, slots=True)
class Verdict:
    losses: list[SeqGap]
    """Sequences gone for good, from ``next_seq`` on, contiguous."""
    rewind: bool
    """A missing sequence still exists: recreate the consumer at ``next_seq`` after the losses."""


def losses_between(first: int, end: int, stream_first: int) -> list[SeqGap]:
    """``first..end-1`` as losses, split at the stream's first sequence (evicted below, deleted above)."""
    out = []
    split = min(max(stream_first, first), end)
    if split > first:
        out.append(SeqGap(first, split - 1, EVICTED))
    if end > split:
        out.append(SeqGap(split, end - 1, DELETED))
    return out


def judge(next_seq: int, delivered: int | None, view: StreamView) -> Verdict:
    """Which of ``next_seq..delivered-1`` are lost, and whether the consumer must rewind.

    Args:
        next_seq: the sequence the daemon needs.
        delivered: the first sequence delivered past it; None when nothing came although the
            consumer says it delivered (or holds) more: then the stream's end bounds the question.
        view: the stream, asked after the gap was seen.
    """
    end = view.last_seq + 1 if delivered is None else delivered
    if view.existing is not None and view.existing < end:
        # Still there: it was delivered somewhere else (lost in flight, another puller) or is
        # waiting for redelivery. Whatever lies before it is gone.
        return Verdict(losses_between(next_seq, view.existing, view.first_seq), rewind=True)
    # Nothing left below ``end``. Without a delivery to go on from, the consumer is stuck
    # past the end of what it can give: start it again after the losses.
    return Verdict(losses_between(next_seq, end, view.first_seq), rewind=delivered is None)


def recreated(next_seq: int, last_seq: int) -> bool:
    """Whether a stream whose last sequence is ``last_seq`` cannot be the one ``next_seq`` came from.

    Sequences never go back within one stream (a purge keeps ``last_seq``), so a stream that
    ends before what was already consumed is a new one.
    """
    return last_seq < next_seq - 1
