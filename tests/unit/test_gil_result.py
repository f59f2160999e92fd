"""A GIL measurement's result (``agents/gil/result.py``) as the wire record the agent publishes."""

from __future__ import annotations

import msgspec
from gil_results import gil_result as _result

from trainvigil.schemas import Record, ThreadShare


def test_result_becomes_a_wire_record_that_round_trips() -> None:
    record = _result().to_record(123.0)
    assert record.held == 0.97 and record.threads[0] == ThreadShare(
        name="loader", tid=7, share=0.9, state="python", top_functions=["parse (data.py:10)"]
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(record), type=Record) == record
