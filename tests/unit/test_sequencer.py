"""The ingest's ordering rule, without a broker: contiguous runs, redeliveries, gaps, losses."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainvigil.daemon.batch.decode import SeqGap
from trainvigil.daemon.ingest.sequencer import (
    DELETED,
    EVICTED,
    Sequencer,
    StreamView,
    judge,
    losses_between,
    recreated,
)


def _seqs(seqs: list[int], positions: list[int]) -> list[int]:
    return [seqs[i] for i in positions]


def test_an_in_order_delivery_is_taken_whole() -> None:
    seq = Sequencer(5)
    out = seq.admit([5, 6, 7, 8])
    assert out.take == [0, 1, 2, 3] and not out.stale and not out.held and out.gap is None
    assert seq.next_seq == 9


def test_a_delivery_out_of_order_within_itself_is_taken_in_stream_order() -> None:
    seq = Sequencer(1)
    seqs = [3, 1, 4, 2]
    out = seq.admit(seqs)
    assert _seqs(seqs, out.take) == [1, 2, 3, 4]
    assert seq.next_seq == 5


def test_redeliveries_below_next_seq_are_stale_never_taken_twice() -> None:
    seq = Sequencer(10)
    seqs = [7, 10, 8, 11, 10, 9]
    out = seq.admit(seqs)
    assert _seqs(seqs, out.take) == [10, 11]
    assert sorted(_seqs(seqs, out.stale)) == [7, 8, 9, 10]  # the second 10 too
    assert seq.next_seq == 12


def test_a_gap_takes_the_prefix_and_holds_the_rest_unacked() -> None:
    seq = Sequencer(1)
    seqs = [1, 2, 5, 6, 4]
    out = seq.admit(seqs)
    assert _seqs(seqs, out.take) == [1, 2]
    assert out.gap == 4
    assert _seqs(seqs, out.held) == [4, 5, 6]
    assert seq.next_seq == 3, "next_seq stops at the first missing sequence"


def test_held_messages_are_taken_once_the_gap_is_recorded_lost() -> None:
    seq = Sequencer(1)
    seqs = [1, 4, 5]
    out = seq.admit(seqs)
    seq.skip([SeqGap(2, 3, DELETED)])
    again = seq.admit(seqs, out.held)
    assert _seqs(seqs, again.take) == [4, 5] and again.gap is None
    assert seq.next_seq == 6


def test_skip_refuses_a_loss_that_does_not_start_at_next_seq() -> None:
    seq = Sequencer(3)
    with pytest.raises(AssertionError):
        seq.skip([SeqGap(4, 5, DELETED)])


def test_losses_split_at_the_streams_first_sequence() -> None:
    assert losses_between(3, 10, stream_first=6) == [SeqGap(3, 5, EVICTED), SeqGap(6, 9, DELETED)]
    assert losses_between(3, 10, stream_first=1) == [SeqGap(3, 9, DELETED)]
    assert losses_between(3, 10, stream_first=20) == [SeqGap(3, 9, EVICTED)]
    assert losses_between(3, 3, stream_first=1) == []


def test_judge_a_gap_whose_messages_still_exist_rewinds_without_loss() -> None:
    verdict = judge(5, 9, StreamView(first_seq=1, last_seq=20, existing=5))
    assert verdict.losses == [] and verdict.rewind


def test_judge_a_gap_partly_gone_records_what_is_gone_and_rewinds_to_what_is_left() -> None:
    verdict = judge(5, 9, StreamView(first_seq=1, last_seq=20, existing=7))
    assert verdict.losses == [SeqGap(5, 6, DELETED)] and verdict.rewind


def test_judge_a_gap_wholly_gone_records_it_and_goes_on_without_rewind() -> None:
    verdict = judge(5, 9, StreamView(first_seq=7, last_seq=20, existing=9))
    assert verdict.losses == [SeqGap(5, 6, EVICTED), SeqGap(7, 8, DELETED)]
    assert not verdict.rewind


def test_judge_with_nothing_delivered_bounds_the_loss_by_the_streams_end() -> None:
    # Everything after next_seq was purged: the consumer skipped it and has nothing to give.
    verdict = judge(6, None, StreamView(first_seq=46, last_seq=45, existing=None))
    assert verdict.losses == [SeqGap(6, 45, EVICTED)] and verdict.rewind
    verdict = judge(6, None, StreamView(first_seq=1, last_seq=45, existing=6))
    assert verdict.losses == [] and verdict.rewind


def test_a_stream_that_ends_before_what_was_consumed_is_a_new_stream() -> None:
    assert recreated(next_seq=11_193, last_seq=5)
    assert not recreated(next_seq=11_193, last_seq=11_192)  # caught up
    assert not recreated(next_seq=1, last_seq=0)  # empty stream, nothing consumed


class _ModelConsumer:
    """A consumer as the daemon sees it at its worst: delivers in order from a cursor, but loses
    some messages in flight and mixes in redeliveries of older ones, shuffled."""

    def __init__(self, exists: list[int], rng: random.Random) -> None:
        self.exists, self.rng, self.cursor = exists, rng, 1

    def deliver(self) -> list[int]:
        ahead = [s for s in self.exists if s >= self.cursor][: self.rng.randint(0, 8)]
        if ahead:
            self.cursor = ahead[-1] + 1
        delivery = [s for s in ahead if self.rng.random() > 0.2]
        behind = [s for s in self.exists if s < self.cursor]
        delivery += [self.rng.choice(behind) for _ in range(self.rng.randint(0, 2)) if behind]
        self.rng.shuffle(delivery)
        return delivery


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 60),
    gone=st.sets(st.integers(1, 60)),
    evicted_below=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_delivery_order_applies_every_existing_sequence_once_and_records_the_rest(
    n: int, gone: set[int], evicted_below: int, seed: int
) -> None:
    """Whatever the order, duplicates and losses in flight, the rule plus the stream's answers
    apply each existing sequence exactly once, in order, and record each missing one once."""
    exists = [s for s in range(1, n + 1) if s not in gone and s >= evicted_below]
    first_seq = exists[0] if exists else n + 1
    consumer = _ModelConsumer(exists, random.Random(seed))
    seq = Sequencer(1)
    applied: list[int] = []
    lost: list[SeqGap] = []

    def view() -> StreamView:
        return StreamView(first_seq, n, next((s for s in exists if s >= seq.next_seq), None))

    for _ in range(100 * n):
        if seq.next_seq > n:
            break
        delivery = consumer.deliver()
        out = seq.admit(delivery)
        applied += [delivery[i] for i in out.take]
        if not delivery:
            # Nothing came, and the stream goes on past next_seq: what the idle check does when
            # the consumer owes messages (stuck) or says it has none left (the drain's last look).
            verdict = judge(seq.next_seq, None, view())
            lost += verdict.losses
            seq.skip(verdict.losses)
            consumer.cursor = seq.next_seq
        while out.gap is not None:
            verdict = judge(seq.next_seq, out.gap, view())
            lost += verdict.losses
            seq.skip(verdict.losses)
            if verdict.rewind:
                consumer.cursor = seq.next_seq
                break
            out = seq.admit(delivery, out.held)
            applied += [delivery[i] for i in out.take]
    assert seq.next_seq == n + 1, "the sequencer reached the end of the stream"
    assert applied == exists, "every existing sequence applied once, in order"
    recorded = [s for gap in lost for s in range(gap.first, gap.last + 1)]
    assert recorded == sorted(set(range(1, n + 1)) - set(exists)), "every missing one recorded once"
    for gap in lost:
        assert gap.reason == (EVICTED if gap.last < first_seq else DELETED)
