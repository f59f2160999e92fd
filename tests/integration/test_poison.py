"""Messages that decode but cannot be stored never stop ingest.

Each kind of poison sits between two valid messages: the valid ones are
stored, the poison is a dead letter with its reason, and the offset moves past all three.
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import nats
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import Daemon, NatsServer, wait_for

from trainvigil.daemon.batch.decode import RawMessage, decode_batch
from trainvigil.daemon.ingest.isolate import write_isolating
from trainvigil.daemon.store.writer import Store
from trainvigil.errors import StoreUnavailableError
from trainvigil.schemas import Envelope, RunEvent, Source, encode

_SRC = {"run_id": "r"}
T = 1_700_000_000.0


def _steps(step: int, times: list[float] | None = None, source: dict[str, Any] | None = None) -> bytes:
    times = times or [1_700_000_000.0]
    record = {
        "type": "steps",
        "time": 1_700_000_000.0,
        "step": np.arange(step, step + len(times), dtype="<i8").tobytes(),
        "times": np.asarray(times, dtype="<f8").tobytes(),
        "columns": {"loss": {"values": np.ones(len(times), dtype="<f8").tobytes()}},
    }
    return msgspec.msgpack.encode({"v": 1, "source": source or _SRC, "records": [record]})


def _record(record: dict[str, Any], source: dict[str, Any] | None = None) -> bytes:
    return msgspec.msgpack.encode({"v": 1, "source": source or _SRC, "records": [record]})


def _deep_event(depth: int) -> bytes:
    """An event whose ``fields`` nest ``depth`` maps deep, written as raw MessagePack
    (msgspec refuses to encode it, as any sane producer would)."""
    head = msgspec.msgpack.encode({"v": 1, "source": _SRC, "records": [{"type": "event", "time": T, "kind": "x"}]})
    # the last record map gets a 4th key: fixmap 0x83 -> 0x84, then "fields": {"a": {"a": ... 1}}
    at = head.rindex(b"\x83")
    return head[:at] + b"\x84" + head[at + 1 :] + msgspec.msgpack.encode("fields") + b"\x81\xa1a" * depth + b"\x01"


POISON: dict[str, bytes] = {
    "event_time_nan": _record({"type": "event", "time": math.nan, "kind": "x"}),
    "heartbeat_time_nan": _record({"type": "heartbeat", "time": math.nan}),
    "run_start_time_nan": _record({"type": "run_start", "time": math.nan}),
    "steps_times_nan": _steps(10, [math.nan]),
    "event_time_inf": _record({"type": "event", "time": math.inf, "kind": "x"}),
    "event_time_1e20": _record({"type": "event", "time": 1e20, "kind": "x"}),
    "steps_times_1e300": _steps(10, [1e300]),
    "event_time_negative": _record({"type": "event", "time": -1e12, "kind": "x"}),
    "steps_rank_2e40": _steps(10, source={"run_id": "r", "rank": 2**40}),
    "heartbeat_rank_2e40": _record({"type": "heartbeat", "time": T}, {"run_id": "r", "rank": 2**40}),
    "world_size_2e40": _record({"type": "heartbeat", "time": T}, {"run_id": "r", "world_size": 2**40}),
    "pid_2e40": _record({"type": "heartbeat", "time": T}, {"run_id": "r", "pid": 2**40}),
    "gil_samples_2e40": _record(
        {
            "type": "gil",
            "time": T,
            "period": 1.0,
            "samples": 2**40,
            **dict.fromkeys(
                ["wait_p50", "wait_p90", "wait_p99", "wait_max", "busy_share", "wait_share", "held", "switch_interval"],
                0.0,
            ),
        }
    ),
    "anomaly_rank_2e40": _record(
        {"type": "anomaly", "time": T, "run_id": "r", "rank": 2**40, "step": 1, "detector": "d", "severity": "warn"}
    ),
    "event_step_u64": _record({"type": "event", "time": T, "kind": "x", "step": 2**64 - 1}),
    "heartbeat_buffered_u64": _record({"type": "heartbeat", "time": T, "buffered": 2**64 - 1}),
    "ckpt_step_2e63": _record({"type": "ckpt", "time": T, "step": 2**63, "algo": "blake3", "root": "ab"}),
    "event_fields_1000_deep": _deep_event(1000),
    "run_id_too_long": _record({"type": "event", "time": T, "kind": "x"}, {"run_id": "r" * 10_000}),
    "event_kind_too_long": _record({"type": "event", "time": T, "kind": "k" * 10_000}),
}


def _valid_event(kind: str) -> bytes:
    return encode(Envelope(source=Source(run_id="r"), records=[RunEvent(time=T, kind=kind)]))


@pytest.mark.parametrize("name", sorted(POISON))
def test_poison_between_valid_messages_is_dead_lettered(name: str, tmp_path: Path) -> None:
    """valid, poison, valid → both valid stored, the poison a dead letter, the offset past all three."""
    store = Store(tmp_path / "v.duckdb")
    msgs = [
        RawMessage("vigil.v1.r.run", _valid_event("before"), 1),
        RawMessage("vigil.v1.r.run", POISON[name], 2),
        RawMessage("vigil.v1.r.run", _valid_event("after"), 3),
    ]
    write_isolating(store, decode_batch(msgs))
    con = store.con
    assert con.execute("select kind from events order by kind").fetchall() == [("after",), ("before",)]
    letters = con.execute("select stream_seq, reason from dead_letters").fetchall()
    assert [seq for seq, _ in letters] == [2], letters
    assert store.last_seq == 3
    store.close()


class _FaultyStore(Store):
    """A real store whose database refuses events of kind ``poison``, as it would a value the
    wire check let through: stands in for a storage failure nobody has found yet."""

    def _write_records(self, b: Any) -> None:
        if any(e.kind == "poison" for _, e in b.events):
            raise duckdb.ConversionException("Conversion Error: refused for the test")
        super()._write_records(b)


def test_a_batch_the_database_refuses_is_split_down_to_the_messages_at_fault(tmp_path: Path) -> None:
    store = _FaultyStore(tmp_path / "v.duckdb")
    kinds = [f"ok{i}" for i in range(40)]  # distinct events: identical old ones would be one resent record
    kinds[7] = kinds[31] = "poison"
    msgs = [RawMessage("vigil.v1.r.run", _valid_event(k), i + 1) for i, k in enumerate(kinds)]
    batch = decode_batch(msgs)
    refused = write_isolating(store, batch)
    assert [d.seq for d in refused] == [8, 32]
    assert all("refused for the test" in d.error for d in refused)
    con = store.con
    assert con.execute("select count(*) from events").fetchone() == (38,)
    assert con.execute("select stream_seq, reason from dead_letters order by 1").fetchall() == [
        (8, "unstorable"),
        (32, "unstorable"),
    ]
    assert store.last_seq == 40
    # The same batch again (a retry after a crash of the caller): nothing is stored twice.
    write_isolating(store, batch)
    assert con.execute("select count(*) from events").fetchone() == (38,)
    assert con.execute("select count(*) from dead_letters").fetchone() == (2,)
    store.close()


_extreme_float = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e300, -1e300, 5e-324, 1.7e9, 4.2e9, 4.2e9 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_extreme_int = st.one_of(
    st.sampled_from([0, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, -(2**63), 2**64 - 1]),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
)
_text = st.one_of(st.text(max_size=20), st.sampled_from(["", "x" * 257, "y" * 70_000, "a\x00b"]))
_json = st.recursive(
    st.none() | st.booleans() | _extreme_float | _extreme_int | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
_source = st.fixed_dictionaries(
    {"run_id": st.one_of(st.just("r"), _text)},
    optional={"rank": _extreme_int, "world_size": _extreme_int, "pid": _extreme_int, "host": _text},
)
_records = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("event"), "time": _extreme_float, "kind": _text},
        optional={"step": st.none() | _extreme_int, "fields": st.dictionaries(st.text(max_size=5), _json, max_size=3)},
    ),
    st.fixed_dictionaries(
        {"type": st.just("heartbeat"), "time": _extreme_float},
        optional={"last_step": _extreme_int, "buffered": _extreme_int, "spilled_bytes": _extreme_int},
    ),
    st.builds(
        lambda step, t: {
            "type": "steps",
            "time": T,
            "step": np.asarray([step % 2**63], dtype="<i8").tobytes(),
            "times": np.asarray([t], dtype="<f8").tobytes(),
            "columns": {"loss": {"values": np.asarray([t], dtype="<f8").tobytes()}},
        },
        _extreme_int,
        _extreme_float,
    ),
)
_messages = st.lists(
    st.builds(
        lambda src, recs: msgspec.msgpack.encode({"v": 1, "source": src, "records": recs}),
        _source,
        st.lists(_records, min_size=1, max_size=3),
    ),
    min_size=1,
    max_size=8,
)


@pytest.mark.timeout(140)  # 60 Hypothesis examples, a DuckDB store each: ~45 s
@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=_messages)
def test_every_message_is_stored_or_dead_lettered_never_both_never_neither(
    payloads: list[bytes], tmp_path_factory: pytest.TempPathFactory
) -> None:
    store = Store(tmp_path_factory.mktemp("prop") / "v.duckdb")
    msgs = [RawMessage("vigil.v1.r.run", p, i + 1) for i, p in enumerate(payloads)]
    write_isolating(store, decode_batch(msgs))  # never raises
    con = store.con
    dead = {seq for (seq,) in con.execute("select stream_seq from dead_letters").fetchall()}
    kept = decode_batch([m for m in msgs if m.seq not in dead])
    expected = {
        "events": _once(
            [(_at(e.time), s.run_id, s.rank, e.kind, e.step, _as_json(e.fields)) for s, e in kept.events],
            store.resent_after_s,
        ),
        "heartbeats": _once(
            [
                (
                    _at(h.time),
                    s.run_id,
                    s.rank,
                    s.host,
                    s.pid,
                    h.last_step,
                    h.buffered,
                    h.spilled_bytes,
                    h.connected,
                    _as_json(h.dropped),
                )
                for s, h in kept.heartbeats
            ],
            store.resent_after_s,
        ),
        "steps": sum(len(part) for part in kept.steps),
    }
    stored = {t: con.execute(f"select count(*) from {t}").fetchone()[0] for t in expected}  # type: ignore[index]
    # steps merge per (run, rank, step): a repeated step in one run is one row
    assert stored["events"] == expected["events"]
    assert stored["heartbeats"] == expected["heartbeats"]
    assert stored["steps"] <= expected["steps"]
    assert store.last_seq == len(msgs)
    store.close()


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)  # to the microsecond, as stored


def _as_json(value: Any) -> bytes:
    return msgspec.json.encode(value, enc_hook=repr)  # a JSON column's text, as stored


def _once(rows: list[tuple[Any, ...]], resent_after_s: float) -> int:
    """How many of ``rows`` (the time first) are stored: every recent one; the old ones once each, a row
    equal in every column to another being a message sent again (``tests/unit/test_store_resends.py``)."""
    horizon = _at(time.time() - resent_after_s)
    old = [row for row in rows if row[0] < horizon]
    return len(rows) - len(old) + len(set(old))


async def _publish(url: str, items: list[tuple[str, bytes]]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for subject, payload in items:
        await js.publish(subject, payload)
    await nc.close()


def test_poison_on_the_bus_never_stops_the_daemon(process_daemon: Daemon, private_nats_server: NatsServer) -> None:
    """Every kind of poison, through a real nats-server and a real daemon."""
    items = [("vigil.v1.r.run", _valid_event("first"))]
    for name in sorted(POISON):
        items.append(("vigil.v1.r.run", POISON[name]))
        items.append(("vigil.v1.r.run", _valid_event(f"after_{name}")))
    asyncio.run(_publish(private_nats_server.url, items))
    wait_for(
        lambda: process_daemon.scalar("select count(*) from events where kind like 'after_%'") == len(POISON),
        60,
        "every valid message behind a poison",
    )
    assert process_daemon.scalar("select count(*) from dead_letters") == len(POISON)
    assert process_daemon.scalar("select count(*) from events") == len(POISON) + 1
    assert process_daemon.process is not None and process_daemon.process.poll() is None, "the daemon keeps running"


class _OutOfMemoryStore(Store):
    """DuckDB out of memory while writing, until ``memory_returns``: a pure fault seam."""

    memory_returns = False

    def _write_records(self, b: Any) -> None:
        if not self.memory_returns:
            raise duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate (for the test)")
        super()._write_records(b)


def test_a_write_out_of_memory_pauses_and_dead_letters_nothing(tmp_path: Path) -> None:
    store = _OutOfMemoryStore(tmp_path / "v.duckdb")
    msgs = [RawMessage("vigil.v1.r.run", _valid_event(f"ok{i}"), i + 1) for i in range(10)]
    batch = decode_batch(msgs)
    with pytest.raises(StoreUnavailableError) as caught:
        write_isolating(store, batch)
    assert caught.value.cause == "out_of_memory"
    assert "store.memory_limit_bytes" in str(caught.value)
    assert store.con.execute("select count(*) from dead_letters").fetchone() == (0,)
    assert store.last_seq == 0, "nothing committed: the stream keeps every message"
    store.memory_returns = True
    assert write_isolating(store, batch) == []
    assert store.con.execute("select count(*) from events").fetchone() == (10,)
    store.close()


def test_duckdb_memory_is_bounded_and_sql_cannot_raise_the_bound(tmp_path: Path) -> None:
    store = Store(tmp_path / "v.duckdb", memory_limit_bytes=64 * 2**20)
    con = store.cursor()
    assert con.execute("select current_setting('memory_limit')").fetchone() == ("64.0 MiB",)
    with pytest.raises(duckdb.Error):
        con.execute("set memory_limit = '10GB'")
    with pytest.raises(duckdb.OutOfMemoryException):
        con.execute("select list(i) from range(50000000) t(i)").fetchall()
    store.close()
