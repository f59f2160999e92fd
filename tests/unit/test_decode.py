"""Decoding a fetch of wire messages (``daemon/batch/decode.py``): records routed, bad messages dead-lettered whole."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from trainvigil.daemon.batch.decode import RawMessage, decode_batch, step_columns
from trainvigil.errors import WireError
from trainvigil.schemas import (
    CheckpointDigest,
    Column,
    Envelope,
    GilSample,
    Heartbeat,
    RunEnd,
    RunEvent,
    RunStart,
    Source,
    StepBatch,
    encode,
)

SOURCE = Source(run_id="run-a", rank=1, world_size=2, host="h", pid=7)


def _steps_batch(n: int, *, loss_len: int | None = None, present: bytes = b"") -> StepBatch:
    return StepBatch(
        time=1.0,
        step=np.arange(n, dtype="<i8").tobytes(),
        times=np.full(n, 100.0, dtype="<f8").tobytes(),
        columns={
            "loss": Column(values=np.ones(n if loss_len is None else loss_len, dtype="<f8").tobytes()),
            "my_custom": Column(values=np.arange(n, dtype="<f8").tobytes(), present=present),
        },
    )


def _msg(seq: int, data: bytes, subject: str = "vigil.v1.run-a.metrics") -> RawMessage:
    return RawMessage(subject=subject, data=data, seq=seq)


def _envelope(*records: object, source: Source = SOURCE) -> bytes:
    return encode(Envelope(source=source, seq=1, records=list(records)))  # type: ignore[arg-type]


def test_decode_batch_dead_letters_bad_messages_with_distinct_reasons_and_keeps_good_ones() -> None:
    good = _envelope(_steps_batch(4), RunStart(time=0.0))
    raw = msgspec.to_builtins(Envelope(source=SOURCE, records=[RunEnd(time=0.0)]), builtin_types=(bytes,))
    raw["v"] = 2
    wrong_version = msgspec.msgpack.encode(raw)
    truncated = good[: len(good) // 2]
    short_column = _envelope(_steps_batch(4, loss_len=3))
    also_good = _envelope(Heartbeat(time=0.0, last_step=3))
    batch = decode_batch(
        [
            _msg(10, good),
            _msg(11, b"\x00garbage\xff"),
            _msg(12, wrong_version),
            _msg(13, truncated),
            _msg(14, short_column),
            _msg(15, also_good, "vigil.v1.run-a.hb"),
        ]
    )
    assert batch.messages == 6
    assert batch.max_seq == 15
    reasons = {d.seq: d.reason for d in batch.dead_letters}
    assert reasons == {11: "malformed", 12: "schema_version", 13: "malformed", 14: "invalid_batch"}
    errors = {d.seq: d.error for d in batch.dead_letters}
    assert "truncated" in errors[13].lower()
    assert errors[11] != errors[13]
    assert "version 2" in errors[12]
    for dead in batch.dead_letters:
        assert dead.error
        assert dead.subject == "vigil.v1.run-a.metrics"
    assert next(d for d in batch.dead_letters if d.seq == 12).data == wrong_version
    assert "'loss'" in next(d for d in batch.dead_letters if d.seq == 14).error
    assert batch.step_rows == 4
    assert len(batch.run_starts) == 1
    assert len(batch.heartbeats) == 1
    assert batch.events_ingested == 6


def test_decode_batch_dead_letters_a_bad_message_whole() -> None:
    """A message with a good record and a bad step batch contributes nothing."""
    data = _envelope(RunStart(time=0.0), RunEvent(time=0.0, kind="k"), _steps_batch(3, present=b"\x01"))
    batch = decode_batch([_msg(1, data)])
    assert [d.reason for d in batch.dead_letters] == ["invalid_batch"]
    assert batch.run_starts == [] and batch.events == [] and batch.steps == []
    assert batch.events_ingested == 0


def test_decode_batch_rejects_empty_run_id_as_invalid() -> None:
    batch = decode_batch([_msg(1, _envelope(RunStart(time=0.0), source=Source(run_id="")))])
    assert [d.reason for d in batch.dead_letters] == ["invalid"]


def test_decode_batch_routes_every_record_type() -> None:
    records = [
        _steps_batch(2),
        RunStart(time=0.0),
        RunEnd(time=0.0),
        RunEvent(time=0.0, kind="x"),
        Heartbeat(time=0.0),
        GilSample(
            time=0.0,
            period=1,
            samples=1,
            wait_p50=0,
            wait_p90=0,
            wait_p99=0,
            wait_max=0,
            busy_share=0,
            wait_share=0,
            held=0,
            switch_interval=0.005,
        ),
        CheckpointDigest(time=0.0, step=1, algo="a", root="r"),
    ]
    batch = decode_batch([_msg(1, _envelope(*records))])
    assert not batch.dead_letters
    assert (len(batch.steps), len(batch.run_starts), len(batch.run_ends), len(batch.events)) == (1, 1, 1, 1)
    assert (len(batch.heartbeats), len(batch.gil_samples), len(batch.checkpoints)) == (1, 1, 1)
    assert batch.run_starts[0][0] == SOURCE
    # Anomalies and canary verdicts are the daemon's own output, refused from the wire (test_record_authority).
    assert batch.events_ingested == 2 + 6


def test_step_columns_splits_known_and_custom_metrics_with_masks() -> None:
    cols = step_columns(SOURCE, _steps_batch(3, present=b"\x01\x00\x01"))
    assert len(cols) == 3
    assert cols.step.tolist() == [0, 1, 2]
    assert set(cols.known) == {"loss"} and set(cols.custom) == {"my_custom"}
    values, mask = cols.known["loss"]
    assert values.tolist() == [1.0, 1.0, 1.0] and mask is None
    values, mask = cols.custom["my_custom"]
    assert mask is not None and mask.tolist() == [True, False, True]


def test_step_columns_rejects_step_bytes_that_are_not_int64s() -> None:
    batch = StepBatch(time=0.0, step=b"\x00" * 7, times=b"")
    with pytest.raises(WireError) as info:
        step_columns(SOURCE, batch)
    assert info.value.reason == "invalid_batch"


def test_step_columns_rejects_times_of_the_wrong_length() -> None:
    batch = StepBatch(time=0.0, step=np.arange(2, dtype="<i8").tobytes(), times=b"\x00" * 8)
    with pytest.raises(WireError, match="times"):
        step_columns(SOURCE, batch)
