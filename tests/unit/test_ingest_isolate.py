"""Ingest splits a batch the store refuses for its content down to the messages at fault
(``daemon/ingest/isolate.py``), against a hand-written store that refuses chosen messages."""

from __future__ import annotations

import pytest

from trainvigil.daemon.batch.decode import IngestBatch, RawMessage, SeqGap, decode_batch
from trainvigil.daemon.ingest.isolate import unapplied, write_isolating
from trainvigil.errors import BatchUnstorableError, StoreUnavailableError
from trainvigil.schemas import Anomaly, Envelope, RunEvent, Source, encode

T = 1_700_000_000.0


def _message(seq: int, kind: str) -> RawMessage:
    data = encode(Envelope(source=Source(run_id="r"), records=[RunEvent(time=T, kind=kind)]))
    return RawMessage("vigil.v1.r.run", data, seq)


class _Store:
    """Commits whole batches of decoded records, refusing any batch with an event of kind ``poison``;
    ``unavailable`` makes every write fail as a full disk does."""

    def __init__(self) -> None:
        self.last_seq = 0
        self.committed: list[IngestBatch] = []
        self.unavailable = False
        self.settled = 0

    def settle(self) -> None:
        self.settled += 1

    def write(self, batch: IngestBatch) -> None:
        if self.unavailable:
            raise StoreUnavailableError("fake", "No space left on device", "disk_full")
        if batch.raw and batch.raw[0].seq <= self.last_seq:
            raise AssertionError(f"message {batch.raw[0].seq} written again")
        if any(e.kind == "poison" for _, e in batch.events):
            raise BatchUnstorableError("fake", "ConversionException: refused for the test")
        self.committed.append(batch)
        self.last_seq = max(self.last_seq, batch.max_seq)

    def kinds(self) -> list[str]:
        return [e.kind for b in self.committed for _, e in b.events]


def test_a_clean_batch_is_one_write() -> None:
    store = _Store()
    assert write_isolating(store, decode_batch([_message(1, "a"), _message(2, "b")])) == []
    assert len(store.committed) == 1 and store.last_seq == 2 and store.settled == 1


def test_only_the_messages_at_fault_become_dead_letters_in_sequence_order() -> None:
    store = _Store()
    kinds = [f"ok{i}" for i in range(12)]
    kinds[2] = kinds[9] = "poison"
    alert = Anomaly(time=T, run_id="r", rank=0, step=1, detector="d", severity="page")
    batch = decode_batch([_message(i + 1, k) for i, k in enumerate(kinds)])
    batch.anomalies.append(alert)
    batch.losses = [SeqGap(20, 21, "evicted")]
    refused = write_isolating(store, batch)
    assert [(d.seq, d.reason, d.error) for d in refused] == [
        (3, "unstorable", "ConversionException: refused for the test"),
        (10, "unstorable", "ConversionException: refused for the test"),
    ]
    assert store.kinds() == [k for k in kinds if k != "poison"]
    letters = [d.seq for b in store.committed for d in b.dead_letters]
    assert letters == [3, 10]
    tail = store.committed[-1]
    assert tail.anomalies == [alert] and tail.losses == batch.losses, "the daemon's alerts and the losses after"
    assert store.last_seq == 12


def test_a_retry_leaves_out_what_an_earlier_try_committed() -> None:
    store = _Store()
    batch = decode_batch([_message(i, f"e{i}") for i in range(1, 7)])
    store.last_seq = 4  # a try that failed half way had committed messages 1..4
    assert write_isolating(store, batch) == []
    assert store.kinds() == ["e5", "e6"]
    rest = unapplied(batch, 6)
    assert rest.raw == [] and rest.max_seq == 6, "a batch wholly committed writes nothing of its messages"


def test_a_store_that_cannot_write_is_waited_for_never_dead_lettered() -> None:
    store = _Store()
    store.unavailable = True
    with pytest.raises(StoreUnavailableError):
        write_isolating(store, decode_batch([_message(1, "poison"), _message(2, "ok")]))
    assert store.committed == []
