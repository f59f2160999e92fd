"""A message sent again after JetStream's duplicate window is stored once.

JetStream drops a message whose ``Nats-Msg-Id`` it saw within ``stream.duplicate_window_s`` (120 s). An
agent resends what it holds unacknowledged: after a lost ack, a kill mid-drain of a spill file, or a
``vigil push`` killed mid-file, the resend can come minutes or days later, from the file. Steps were
already merged by (run, rank, step); events, heartbeats, GIL samples and checkpoint digests were stored
a second time. Now a record older than half the window that equals a stored row in every column is
skipped (real DuckDB files; the messages are the wire bytes an agent sends).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainvigil.daemon.batch.decode import RawMessage, decode_batch
from trainvigil.daemon.ingest.isolate import write_isolating
from trainvigil.daemon.store.writer import Store
from trainvigil.schemas import Envelope, Source, encode
from trainvigil.schemas.records import CheckpointDigest, GilSample, Heartbeat, RunEvent, ThreadShare

TABLES = ("events", "heartbeats", "gil_samples", "checkpoints")


def _records(at: float, step: int = 5, **fields: Any) -> list[Any]:
    return [
        RunEvent(time=at, kind="eval", step=step, fields=fields or {"acc": 0.5, "nested": {"k": [1, 2]}}),
        Heartbeat(time=at, last_step=step, buffered=3, dropped={"spill_full": 2}),
        GilSample(
            time=at,
            period=1.0,
            samples=100,
            wait_p50=1e-4,
            wait_p90=2e-4,
            wait_p99=3e-4,
            wait_max=4e-4,
            busy_share=0.5,
            wait_share=0.1,
            held=0.4,
            switch_interval=0.005,
            threads=[ThreadShare(name="MainThread", tid=1, share=0.9)],
        ),
        CheckpointDigest(time=at, step=step, algo="blake3", root="ab" * 16, tensors={"w": "cd" * 16}, path="/c/5.pt"),
    ]


def _message(stream_seq: int, records: list[Any], agent_seq: int = 1) -> RawMessage:
    envelope = Envelope(source=Source(run_id="r", host="h", pid=7), seq=agent_seq, records=records)
    return RawMessage("vigil.v1.r.run", encode(envelope), stream_seq)


def _counts(store: Store) -> dict[str, int]:
    con = store.cursor()
    return {table: con.execute(f"select count(*) from {table}").fetchall()[0][0] for table in TABLES}


def test_a_message_resent_past_the_duplicate_window_is_stored_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "v.duckdb", duplicate_window_s=120)
    old = time.time() - 3600  # made an hour ago: its resend now is past any duplicate window
    store.write(decode_batch([_message(1, _records(old))]))
    assert _counts(store) == dict.fromkeys(TABLES, 1)
    # The same message again, as a later stream message (JetStream stored it: its window had passed).
    assert write_isolating(store, decode_batch([_message(2, _records(old))])) == []
    assert _counts(store) == dict.fromkeys(TABLES, 1)
    assert store.last_seq == 2
    # Twice within one fetched batch (both copies waited in the stream while the daemon was down).
    store.write(decode_batch([_message(3, _records(old + 1), 2), _message(4, _records(old + 1), 2)]))
    assert _counts(store) == dict.fromkeys(TABLES, 2)
    store.close()


def test_records_that_differ_in_any_column_are_all_kept(tmp_path: Path) -> None:
    store = Store(tmp_path / "v.duckdb", duplicate_window_s=120)
    old = time.time() - 3600
    store.write(decode_batch([_message(1, _records(old))]))
    store.write(decode_batch([_message(2, _records(old, step=6))]))  # same time, another step
    store.write(decode_batch([_message(3, _records(old, acc=0.75)[:1])]))  # same time and step, other fields
    assert _counts(store) == {"events": 3, "heartbeats": 2, "gil_samples": 1, "checkpoints": 2}
    con = store.cursor()
    assert con.execute("select count(*) from events where fields->>'acc' = '0.75'").fetchall() == [(1,)]
    store.close()


def test_records_of_now_are_appended_without_a_lookup(tmp_path: Path) -> None:
    """Within the window JetStream itself drops a resend, so a fresh record costs no lookup: two copies
    that reach the store (never from an agent: the same Nats-Msg-Id) are both kept, and so are two
    records of the same instant that an agent really sent twice."""
    store = Store(tmp_path / "v.duckdb", duplicate_window_s=120)
    now = time.time()
    store.write(decode_batch([_message(1, _records(now))]))
    store.write(decode_batch([_message(2, _records(now))]))
    assert _counts(store) == dict.fromkeys(TABLES, 2)
    store.close()
