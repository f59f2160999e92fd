"""Whatever a training script passes to ``log()`` and ``event()``, the agent's thread survives it:
well-formed values arrive exactly, the rest are dropped, counted and named, and ``close()`` says
whether anything was lost."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import re
import sys
import threading
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import nats
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support import NatsServer, wait_for

import trainvigil
from trainvigil.agents import Agent
from trainvigil.agents._values import MAX_ITEMS, make_event
from trainvigil.agents.transport import batcher as worker_module
from trainvigil.agents.transport import columnar
from trainvigil.agents.transport.columnar import Entry, StepBatchBuilder, _to_floats, build_step_batch
from trainvigil.daemon.broker.jetstream import ensure_stream
from trainvigil.daemon.config import StreamConfig
from trainvigil.schemas import DEFAULT_SUBJECTS, Envelope, RunEvent, RunStart, StepBatch, decode, run_token
from trainvigil.schemas.limits import MAX_FIELDS_DEPTH, MAX_NAME, fields_depth

# The agent never needs torch; only the tensor cases do, and they import it (collecting this module stays light).
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")

NAN = "NaN"  # NaN stands in for itself in comparisons (NaN != NaN)


class Boom:
    """A number-like object whose conversion raises."""

    def __float__(self) -> float:
        raise ZeroDivisionError("no float for you")

    def __repr__(self) -> str:
        return "Boom()"


class Poison:
    """Converts fine; the tests that inject a worker failure key on it."""

    def __float__(self) -> float:
        return 1.0


def _canon(value: Any) -> Any:
    """``value`` with NaN replaced by a marker and tuples by lists, so ``==`` compares what went on the wire."""
    if isinstance(value, float) and math.isnan(value):
        return NAN
    if isinstance(value, list | tuple):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    return value


def _rows(batch: StepBatch) -> list[tuple[int, dict[str, Any]]]:
    """One (step, {metric: value}) per row; a metric not present in a row is absent from its dict."""
    steps = np.frombuffer(batch.step, dtype="<i8").tolist()
    rows: list[tuple[int, dict[str, Any]]] = [(s, {}) for s in steps]
    for name, col in batch.columns.items():
        values = np.frombuffer(col.values, dtype="<f8").tolist()
        assert len(values) == len(steps)
        for i, v in enumerate(values):
            if not col.present or col.present[i]:
                rows[i][1][name] = _canon(v)
    return rows


# ---- the columnar builder: every kind of value ------------------------------------------------

GOOD_VALUES: list[tuple[Any, float]] = [
    (0.1, 0.1),
    (7, 7.0),
    (True, 1.0),
    (2**70, float(2**70)),
    (-(2**64), float(-(2**64))),
    (math.nan, math.nan),
    (-math.inf, -math.inf),
    (Fraction(1, 4), 0.25),
    (Decimal("0.5"), 0.5),
    (np.float64(0.1), 0.1),
    (np.float32(0.1), float(np.float32(0.1))),
    (np.float16(0.1), float(np.float16(0.1))),
    (np.longdouble(1.5), 1.5),
    (np.float32("nan"), math.nan),
    (np.int8(-128), -128.0),
    (np.uint8(255), 255.0),
    (np.int16(-3), -3.0),
    (np.uint16(65535), 65535.0),
    (np.int32(-(2**31)), float(-(2**31))),
    (np.uint32(2**32 - 1), float(2**32 - 1)),
    (np.int64(2**62), float(2**62)),
    (np.uint64(2**64 - 1), float(2**64 - 1)),
    (np.bool_(True), 1.0),
    (np.bool_(False), 0.0),
    (np.array(2.5), 2.5),
    (np.array(3, dtype=np.int8), 3.0),
    (np.array(True), 1.0),
    (np.array([4.5]), 4.5),
    (np.array([[7]], dtype=np.uint16), 7.0),
    (np.array([0.25], dtype=np.float16), 0.25),
]

BAD_VALUES: list[Any] = [
    np.array([1.0, 2.0]),
    np.zeros((0,)),
    np.ones((2, 2)),
    np.array(["x"]),
    np.array(1 + 2j),
    "1.5",
    "loss",
    b"1.5",
    bytearray(b"2"),
    None,
    [1.0],
    (1.0,),
    {"a": 1.0},
    1 + 2j,
    np.complex128(1),
    np.datetime64("2020-01-01"),
    np.str_("3"),
    Boom(),
    10**400,
    -(10**400),
    object(),
]


def _expect_row(values: list[tuple[Any, float]]) -> list[Any]:
    return [_canon(v) for _, v in values]


@pytest.mark.parametrize("layout", ["one column", "one row"])
def test_builder_keeps_every_kind_of_number_exactly_and_drops_the_rest_counted(layout: str) -> None:
    """Good and bad values mixed: good ones arrive as float64 exactly, bad ones are absent and counted."""
    mixed: list[tuple[Any, Any]] = [*GOOD_VALUES, *((v, None) for v in BAD_VALUES)]
    if layout == "one column":
        entries: list[Entry] = [(i, 0.0, {"m": v}) for i, (v, _) in enumerate(mixed)]
    else:
        entries = [(0, 0.0, {f"m{i}": v for i, (v, _) in enumerate(mixed)})]
    batch, dropped = build_step_batch(entries, now=0.0)
    assert batch is not None
    assert dropped == {"bad_value": len(BAD_VALUES)}
    rows = _rows(batch)
    if layout == "one column":
        got = [row.get("m", "absent") for _, row in rows]
    else:
        got = [rows[0][1].get(f"m{i}", "absent") for i in range(len(mixed))]
    expected = [_canon(want) if want is not None else "absent" for _, want in mixed]
    assert got == expected


def test_builder_fast_path_takes_numpy_scalars_of_every_dtype() -> None:
    """A chunk of only NumPy scalars and Python numbers (no fallback) still converts each exactly."""
    scalars = [(v, want) for v, want in GOOD_VALUES if type(v) in columnar.SCALAR_TYPES]
    assert len(scalars) >= 15
    entries: list[Entry] = [(i, 0.0, {"a": v, "b": v}) for i, (v, _) in enumerate(scalars)]
    batch, dropped = build_step_batch(entries, now=0.0)
    assert batch is not None and not dropped
    assert [row["a"] for _, row in _rows(batch)] == _expect_row(scalars)


@pytest.mark.parametrize("bad", BAD_VALUES, ids=lambda v: type(v).__name__)
def test_one_bad_value_drops_only_itself_and_is_named_with_its_step(bad: Any) -> None:
    entries: list[Entry] = [(s, 0.0, {"loss": float(s), "acc": 0.5}) for s in range(10, 20)]
    entries[4] = (14, 0.0, {"loss": 14.0, "acc": bad})
    builder = StepBatchBuilder()
    builder.add(entries)
    batch = builder.finish(0.0)
    assert batch is not None
    assert builder.dropped == {"bad_value": 1}
    rows = _rows(batch)
    assert [s for s, _ in rows] == list(range(10, 20))
    assert [row["loss"] for _, row in rows] == [float(s) for s in range(10, 20)]
    assert [row.get("acc") for _, row in rows] == [0.5] * 4 + [None] + [0.5] * 5
    [(reason, note)] = builder.notes
    assert reason == "bad_value"
    assert "'acc'" in note and "step 14" in note, note


def test_only_the_first_few_drops_are_described() -> None:
    entries: list[Entry] = [(s, 0.0, {"x": "bad"}) for s in range(50)]
    builder = StepBatchBuilder()
    for lo in range(0, 50, 7):
        builder.add(entries[lo : lo + 7])
    assert builder.dropped == {"bad_value": 50}
    assert [n for _, n in builder.notes] == [f"metric 'x' at step {s}: str 'bad' is not a number" for s in range(5)]


@pytest.mark.parametrize(
    "step", [2**63, -(2**63) - 1, np.uint64(2**63), 1.0, np.float32(2.0), "1", None, True, np.bool_(False)], ids=repr
)
def test_steps_that_are_not_int64_drop_their_entry_and_are_named(step: Any) -> None:
    entries: list[Entry] = [(2**63 - 1, 0.0, {"loss": 1.0}), (step, 0.0, {"loss": 2.0}), (np.uint32(3), 0.0, {})]
    builder = StepBatchBuilder()
    builder.add(entries)
    batch = builder.finish(0.0)
    assert batch is not None
    assert builder.dropped == {"bad_step": 1}
    assert _rows(batch) == [(2**63 - 1, {"loss": 1.0}), (3, {})]
    [(reason, note)] = builder.notes
    assert reason == "bad_step" and "not an int" in note and "'loss'" in note


def test_metric_name_that_is_not_utf8_is_dropped_not_the_batch() -> None:
    batch, dropped = build_step_batch([(0, 0.0, {"loss": 1.0, "bad\udc80": 2.0})], now=0.0)
    assert batch is not None
    assert dropped == {"bad_value": 1}
    assert _rows(batch) == [(0, {"loss": 1.0})]
    msgspec.msgpack.encode(batch)  # what is left encodes


@needs_torch
def test_builder_reads_tensors_of_every_kind_and_drops_the_rest() -> None:
    import torch

    weight = torch.tensor(1.5, requires_grad=True)
    good = [
        (torch.tensor(0.1), float(torch.tensor(0.1))),
        (weight * 2, 3.0),  # requires_grad, with a grad_fn: read without a warning
        (torch.tensor(0.1, dtype=torch.float16), float(torch.tensor(0.1, dtype=torch.float16))),
        (torch.tensor(0.1, dtype=torch.bfloat16), float(torch.tensor(0.1, dtype=torch.bfloat16))),
        (torch.tensor(-5, dtype=torch.int8), -5.0),
        (torch.tensor(2**40, dtype=torch.int64), float(2**40)),
        (torch.tensor(True), 1.0),
        (torch.tensor([2.5]), 2.5),
        (torch.tensor(float("nan")), math.nan),
    ]
    bad = [torch.ones(2), torch.zeros(0), torch.tensor(1 + 1j), torch.ones(2, 2, requires_grad=True)]
    entries: list[Entry] = [(i, 0.0, {"t": v}) for i, (v, _) in enumerate(good)]
    entries += [(100 + i, 0.0, {"t": v}) for i, v in enumerate(bad)]
    batch, dropped = build_step_batch(entries, now=0.0)
    assert batch is not None
    assert dropped == {"bad_value": len(bad)}
    assert [row.get("t") for _, row in _rows(batch)] == [*_expect_row(good), *[None] * len(bad)]


@needs_torch
def test_a_column_of_tensors_alone_is_read_whole_as_the_values_themselves() -> None:
    import torch

    weight = torch.tensor(0.5, requires_grad=True)
    kinds = [
        lambda i: torch.tensor(i / 7),
        lambda i: weight * i,  # requires_grad, with a grad_fn
        lambda i: torch.tensor(i, dtype=torch.int32),
        lambda i: torch.tensor([i / 3]).to(torch.bfloat16),
    ]
    column = [kinds[i % 4](i) for i in range(40)]  # one type, every value one number: read in one pass
    batch, dropped = build_step_batch([(i, 0.0, {"t": v, "x": 1.0}) for i, v in enumerate(column)], now=0.0)
    assert batch is not None and dropped == {}
    assert [row["t"] for _, row in _rows(batch)] == [float(v.detach().reshape(())) for v in column]


def _tensor_kinds() -> list[tuple[str, Any]]:
    """Nine kinds of tensor, each made from one float: (name, maker)."""
    import torch

    return [
        ("float32", lambda x: torch.tensor(x)),
        ("float16", lambda x: torch.tensor(x, dtype=torch.float16)),
        ("bfloat16, 1 element", lambda x: torch.tensor([x], dtype=torch.bfloat16)),
        ("int64", lambda x: torch.tensor(int(max(-1e15, min(1e15, x))) if math.isfinite(x) else 7)),
        ("bool", lambda x: torch.tensor(x > 0)),
        ("requires grad", lambda x: torch.tensor(x, requires_grad=True) * 1),
        ("two elements", lambda x: torch.tensor([x, x])),
        ("empty", lambda x: torch.zeros(0)),
        ("complex", lambda x: torch.tensor(complex(x, 1.0))),
    ]


@needs_torch
@settings(max_examples=200, deadline=None)
@given(column=st.lists(st.tuples(st.integers(0, 8), st.floats(width=32)), min_size=1, max_size=12))
def test_a_column_of_tensors_reads_each_tensor_holding_one_real_number_and_refuses_the_rest(
    column: list[tuple[int, float]],
) -> None:
    kinds = _tensor_kinds()
    values = [kinds[k][1](x) for k, x in column]
    got, present = _to_floats(values)
    # the oracle, independent of the agent's readers: one real element, or refused
    expected = [None if v.numel() != 1 or v.is_complex() else float(v.detach().reshape(())) for v in values]
    assert (present is None) == all(e is not None for e in expected)
    if present is not None:
        assert present.tolist() == [e is not None for e in expected]
    for value, e in zip(got.tolist(), expected, strict=True):
        if e is not None:
            assert value == e or (math.isnan(value) and math.isnan(e))


# ---- event fields ---------------------------------------------------------------------------


def test_event_fields_convert_numpy_values_to_wire_values() -> None:
    event, refused = make_event(
        1.0,
        "eval",
        np.int64(7),
        {
            "accuracy": np.mean(np.array([0.5, 0.75])),
            "f32": np.float32(0.25),
            "f16": np.float16(0.5),
            "i64": np.int64(-3),
            "u64": np.uint64(2**64 - 1),
            "flag": np.bool_(True),
            "hist": np.arange(4, dtype=np.int16),
            "grid": np.ones((2, 2), dtype=np.float32),
            "names": np.array(["a", "b"]),
            "zero_d": np.array(1.5),
            "nested": {"k": [1, "two", (3.0, None)], 5: True},
            "big_int": 2**64 - 1,
            "text": "ok",
        },
    )
    assert refused == []
    assert event.kind == "eval" and event.step == 7 and type(event.step) is int
    assert event.fields == {
        "accuracy": 0.625,
        "f32": 0.25,
        "f16": 0.5,
        "i64": -3,
        "u64": 2**64 - 1,
        "flag": True,
        "hist": [0, 1, 2, 3],
        "grid": [[1.0, 1.0], [1.0, 1.0]],
        "names": ["a", "b"],
        "zero_d": 1.5,
        "nested": {"k": [1, "two", [3.0, None]], "5": True},
        "big_int": 2**64 - 1,
        "text": "ok",
    }
    assert type(event.fields["accuracy"]) is float and type(event.fields["i64"]) is int
    assert type(event.fields["flag"]) is bool
    _assert_round_trips(event)


def _assert_round_trips(event: RunEvent) -> None:
    """The event survives the real codec (what the daemon decodes)."""
    from trainvigil.schemas import Source, encode

    envelope = decode(encode(Envelope(source=Source(run_id="r"), seq=1, records=[event])))
    assert _canon(envelope.records[0].fields) == _canon(event.fields)  # type: ignore[union-attr]


def test_event_fields_that_cannot_go_on_the_wire_are_dropped_and_named() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    deep: Any = 1.0
    for _ in range(MAX_FIELDS_DEPTH + 5):
        deep = [deep]
    event, refused = make_event(
        1.0,
        "eval",
        3,
        {
            "ok": 1.0,
            "obj": object(),
            "boom": Boom(),
            "huge": 2**64,
            "cplx": 1 + 2j,
            "bytes": b"x",
            "big_array": np.zeros(MAX_ITEMS + 1),
            "long_list": [0] * (MAX_ITEMS + 1),
            "objects": np.array([object()]),
            "surrogate": "a\udc80",
            "cycle": cycle,
            "deep": deep,
            "partly": {"good": 1, "bad": object(), (1, 2): 3, "list": [1, object(), 3]},
        },
    )
    assert event.fields["ok"] == 1.0
    assert event.fields["partly"] == {"good": 1, "list": [1, None, 3]}
    assert set(event.fields) == {"ok", "cycle", "deep", "partly"}
    reasons = [r for r, _ in refused]
    assert reasons == ["bad_field"] * 14
    notes = " | ".join(n for _, n in refused)
    for name in ["obj", "boom", "huge", "cplx", "bytes", "big_array", "long_list", "objects", "surrogate"]:
        assert f"field '{name}'" in notes, name
    assert "partly.bad" in notes and "partly.list[1]" in notes
    assert all(n.startswith("event 'eval' at step 3: ") for _, n in refused)
    _assert_round_trips(event)


def _nested(levels: int, leaf: Any = 1.0) -> Any:
    value: Any = leaf
    for _ in range(levels):
        value = [value]
    return value


def test_event_nesting_stops_exactly_where_the_wire_does() -> None:
    """The deepest nesting the daemon decodes is kept; one level more is dropped, not dead-lettered."""
    deepest = MAX_FIELDS_DEPTH - 1  # the fields dict is the first level
    shape = (1,) * deepest
    event, refused = make_event(1.0, "deep", None, {"ok": _nested(deepest), "array": np.zeros(shape)})
    assert refused == []
    assert fields_depth(event.fields) == MAX_FIELDS_DEPTH
    _assert_round_trips(event)
    event, refused = make_event(
        1.0, "deep", None, {"list": _nested(deepest + 1), "array": np.zeros((1, *shape)), "ok": 1}
    )
    # The list level past the limit gives way to None in its parent; the array goes whole.
    assert event.fields == {"list": _nested(deepest, None), "ok": 1}
    assert fields_depth(event.fields) == MAX_FIELDS_DEPTH
    assert [r for r, _ in refused] == ["bad_field", "bad_field"]
    _assert_round_trips(event)


def test_event_kind_longer_than_the_wire_takes_is_cut_and_counted() -> None:
    event, refused = make_event(1.0, "k" * (MAX_NAME + 1), None, {})
    assert event.kind == "k" * MAX_NAME
    assert [r for r, _ in refused] == ["bad_field"]
    _assert_round_trips(event)


def test_an_int_event_kind_with_more_digits_than_a_name_takes_is_cut_and_counted() -> None:
    """The fuzz test's case that CI drew: a 257-digit int as the kind."""
    kind = 10**MAX_NAME + 7
    event, refused = make_event(1.0, kind, None, {})
    assert event.kind == str(kind)[:MAX_NAME]
    assert [r for r, _ in refused] == ["bad_field"]
    _assert_round_trips(event)


def test_metric_name_longer_than_the_wire_takes_is_dropped_not_the_batch() -> None:
    long = "m" * (MAX_NAME + 1)
    batch, dropped = build_step_batch([(0, 0.0, {"loss": 1.0, long: 2.0}), (1, 0.0, {"loss": 2.0, long: 3.0})], 0.0)
    assert batch is not None
    assert dropped == {"bad_value": 2}
    assert _rows(batch) == [(0, {"loss": 1.0}), (1, {"loss": 2.0})]


def test_event_size_is_bounded() -> None:
    many = {f"f{i}": list(range(1000)) for i in range(20)}
    event, refused = make_event(1.0, "big", None, many)
    assert refused, "20 000 values in one event are more than it may hold"
    assert sum(len(v) for v in event.fields.values()) <= 10_000
    long_text = {f"s{i}": "x" * 100_000 for i in range(5)}
    event, refused = make_event(1.0, "big", None, long_text)
    assert len(refused) >= 3
    assert len(msgspec.msgpack.encode(event)) < 512 * 1024


@pytest.mark.parametrize(
    ("kind", "step", "want_kind", "want_step", "bad"),
    [
        (7, 1.5, "7", None, ["bad_step"]),
        (np.str_("k"), np.uint8(3), "k", 3, []),
        ("k", True, "k", None, ["bad_step"]),
        ("k", 2**63, "k", None, ["bad_step"]),
        ("k\udc80", None, "k\\udc80", None, []),
    ],
)
def test_event_kind_becomes_str_and_a_bad_step_is_dropped(
    kind: Any, step: Any, want_kind: str, want_step: int | None, bad: list[str]
) -> None:
    event, refused = make_event(1.0, kind, step, {})
    assert (event.kind, event.step) == (want_kind, want_step)
    assert type(event.kind) is str
    assert [r for r, _ in refused] == bad


@needs_torch
def test_event_fields_read_tensors_at_call_time() -> None:
    import torch

    acc = torch.tensor(0.5, requires_grad=True) * 1
    hist = torch.tensor([1.0, 2.0], dtype=torch.float16)
    event, refused = make_event(
        1.0, "eval", torch.tensor(3), {"acc": acc, "hist": hist, "big": torch.zeros(MAX_ITEMS + 1)}
    )
    hist += 1  # a later in-place change does not reach the event
    assert event.fields == {"acc": 0.5, "hist": [1.0, 2.0]}
    assert event.step is None
    assert sorted(r for r, _ in refused) == ["bad_field", "bad_step"]
    _assert_round_trips(event)


# ---- a real agent and a real nats-server -----------------------------------------------------


async def _create_stream(url: str) -> None:
    nc = await nats.connect(url, connect_timeout=2)
    try:
        await ensure_stream(nc.jetstream(), StreamConfig())
    finally:
        await nc.close()


async def _read_run(url: str, run_id: str) -> list[tuple[str, Envelope]]:
    """Every message of ``run_id`` on the stream, in stream order: (Nats-Msg-Id, envelope)."""
    nc = await nats.connect(url, connect_timeout=2)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(f"{DEFAULT_SUBJECTS.prefix}.{run_token(run_id)}.*", stream=StreamConfig().name)
        want = (await sub.consumer_info()).num_pending
        assert want is not None
        out: list[tuple[str, Envelope]] = []
        while len(out) < want:
            for msg in await sub.fetch(min(256, want - len(out)), timeout=5):
                out.append(((msg.headers or {}).get("Nats-Msg-Id", ""), decode(msg.data)))
                await msg.ack()
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


def _arrived(url: str, run_id: str) -> tuple[list[tuple[int, dict[str, Any]]], list[RunEvent], list[str]]:
    """The step rows, the ``event()`` records and the message ids of a run, as stored by JetStream."""
    rows: list[tuple[int, dict[str, Any]]] = []
    events: list[RunEvent] = []
    ids: list[str] = []
    for msg_id, envelope in asyncio.run(_read_run(url, run_id)):
        ids.append(msg_id)
        for record in envelope.records:
            if isinstance(record, StepBatch):
                rows += _rows(record)
            elif isinstance(record, RunEvent):
                events.append(record)
    return rows, events, ids


@pytest.fixture
def broker(private_nats_server: NatsServer) -> str:
    """A real nats-server with the VIGIL stream (what the daemon would create)."""
    asyncio.run(_create_stream(private_nats_server.url))
    return private_nats_server.url


_runs = iter(range(10**9))


def _agent(url: str, tmp_path: Path, **options: Any) -> Agent:
    run_id = f"values-{next(_runs)}"
    options.setdefault("flush_interval", 0.02)
    return trainvigil.init(run_id=run_id, nats_url=url, spill_dir=tmp_path / "spill", **options)


def _errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "trainvigil.agent" and r.levelno >= logging.ERROR]


def test_numpy_event_field_and_array_metric_lose_only_themselves(
    broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The two reproductions, amid ordinary steps, against a real broker."""
    caplog.set_level(logging.WARNING, logger="trainvigil.agent")
    agent = _agent(broker, tmp_path)
    worker = agent._worker
    assert worker is not None
    scores = np.array([0.5, 0.75, 1.0])
    for step in range(300):
        agent.log(step, loss=1.0 / (step + 1), lr=np.float32(0.5))
        if step == 100:
            agent.event("eval", step=step, accuracy=np.mean(scores), n=np.int64(3), best=np.float32(1.0))
        if step == 200:
            agent.log(step, x=np.array([1.0, 2.0]))
    # run_start, 301 log() calls and the event
    wait_for(lambda: agent.stats()["delivered_events"] >= 303, 20, "every step and the event delivered")
    assert worker.thread.is_alive(), "the agent's thread survived the values"
    agent.log(300, loss=0.5)  # and still delivers after them
    assert agent.close(timeout=10) is False, "a value was dropped, so close() must not say all arrived"
    stats = agent.stats()
    assert stats["dropped"] == {"bad_value": 1}
    rows, events, _ = _arrived(broker, agent.run_id)
    ordinary = [(s, m) for s, m in rows if "loss" in m]
    assert ordinary == [(s, {"loss": 1.0 / (s + 1), "lr": 0.5}) for s in range(300)] + [(300, {"loss": 0.5})]
    assert (200, {}) in rows, "the call whose only value was dropped still marks its step"
    [event] = [e for e in events if e.kind == "eval"]
    assert event.step == 100
    assert event.fields == {"accuracy": 0.75, "n": 3, "best": 1.0}
    assert type(event.fields["accuracy"]) is float and type(event.fields["n"]) is int
    warnings = [r.getMessage() for r in caplog.records if r.name == "trainvigil.agent"]
    assert any("'x' at step 200" in w for w in warnings), warnings
    assert not any("unreachable" in w for w in warnings), "no false hint at the broker"
    assert not _errors(caplog)


def test_close_is_true_when_nothing_was_lost_and_ids_carry_a_random_nonce(broker: str, tmp_path: Path) -> None:
    for _ in range(2):  # same run id, rank, host and pid: only the nonce tells the agents apart
        agent = trainvigil.init(run_id="nonce", nats_url=broker, spill_dir=tmp_path, flush_interval=0.02)
        for step in range(50):
            agent.log(step, loss=float(step))
        agent.event("eval", step=49, acc=0.5)
        assert agent.close(timeout=10) is True, agent.stats()
        assert agent.stats()["dropped"] == {}
    rows, events, ids = _arrived(broker, "nonce")
    assert len(events) == 2, "JetStream de-duplicated the second agent's messages: their ids were predictable"
    assert len(rows) == 100
    assert len(ids) == len(set(ids))
    nonces = set()
    for msg_id in ids:
        match = re.fullmatch(r"nonce/0/[^/]*/\d+/([0-9a-f]{16})/\d+", msg_id)
        assert match, msg_id
        nonces.add(match.group(1))
    assert len(nonces) == 2, "one nonce per agent"


def test_worker_failure_drops_only_the_culprits_and_is_logged_once(
    broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unforeseen exception while packing a step or encoding a record costs that step or record only."""
    real_as_float = columnar.as_float
    real_encode = worker_module.encode

    def as_float(value: Any) -> float | None:
        if isinstance(value, Poison):
            raise RuntimeError("injected packing failure")
        return real_as_float(value)

    def encode(envelope: Envelope) -> bytes:
        if any(isinstance(r, RunEvent) and r.kind == "poison" for r in envelope.records):
            raise RuntimeError("injected encoding failure")
        return real_encode(envelope)

    monkeypatch.setattr(columnar, "as_float", as_float)
    monkeypatch.setattr(worker_module, "encode", encode)
    caplog.set_level(logging.WARNING, logger="trainvigil.agent")
    agent = _agent(broker, tmp_path)
    for step in range(200):
        agent.log(step, loss=Poison() if step in (50, 150) else float(step))
        if step % 40 == 0:
            agent.event("poison" if step in (40, 120) else "fine", step=step)
    assert agent.close(timeout=10) is False
    stats = agent.stats()
    assert stats["dropped"] == {"build_error": 2, "encode_error": 2}
    assert "injected" in stats["last_error"]
    rows, events, _ = _arrived(broker, agent.run_id)
    assert rows == [(s, {"loss": float(s)}) for s in range(200) if s not in (50, 150)]
    assert [e.step for e in events] == [0, 80, 160]
    errors = _errors(caplog)
    assert len(errors) == 2, [r.getMessage() for r in errors]  # once per kind: packing, encoding


def test_stats_from_another_thread_while_logging_and_flushing_never_raises(tmp_path: Path) -> None:
    """No broker, so the outbox keeps growing while stats() reads it, and drop counts keep changing."""
    agent = trainvigil.init(
        run_id="stats", nats_url="nats://127.0.0.1:1", spill_dir=tmp_path, flush_interval=0.001, batch_size=8
    )
    failures: list[BaseException] = []
    reads = 0
    stop = threading.Event()

    def hammer() -> None:
        nonlocal reads
        while not stop.is_set():
            try:
                agent.stats()
                reads += 1
            except BaseException as exc:
                failures.append(exc)
                return

    reader = threading.Thread(target=hammer)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # preempt often, so a read lands in the middle of an update
    reader.start()
    try:
        end = time.monotonic() + 2.0
        step = 0
        while time.monotonic() < end and not failures:
            agent.log(step, loss=1.0, odd="x" if step % 97 == 0 else 1.0)  # type: ignore[arg-type]  # "x" is refused
            if step % 500 == 0:
                agent.log(float(step), loss=1.0)  # type: ignore[arg-type]
                agent.event("e", step=step, field=1.0)
            step += 1
            if step % 64 == 0:
                time.sleep(0.0005)  # let the worker flush
        pending = agent.stats()["pending_events"]
    finally:
        stop.set()
        reader.join(10)
        sys.setswitchinterval(interval)
        agent.close(timeout=0.2)
    assert not failures, repr(failures[0])
    assert reads > 100
    assert pending > 1000, "the outbox grew while it was read"
    # Sealing thousands of small messages into the kept file can take seconds on a slow machine;
    # close() waits for it past its timeout, and close_timeout is counted as that ends.
    assert agent._worker is not None
    assert not agent._worker.thread.is_alive()
    assert {"bad_value", "bad_step", "close_timeout"} <= set(agent.stats()["dropped"])


# ---- fuzzing log() and event() against a real broker ----------------------------------------

_NUMERIC_DTYPES = [np.dtype(c) for c in "?bBhHiIlLqQefd"]


def _numpy_scalar() -> st.SearchStrategy[tuple[Any, Any]]:
    """A NumPy scalar of some numeric dtype, and the Python number it stands for."""
    return st.sampled_from(_NUMERIC_DTYPES).flatmap(hnp.from_dtype).map(lambda v: (v, v.item()))


def _good_metric() -> st.SearchStrategy[tuple[Any, Any]]:
    """(value, the float64 that must arrive)."""
    numbers: list[st.SearchStrategy[tuple[Any, Any]]] = [
        st.floats().map(lambda x: (x, x)),
        st.integers(-(2**100), 2**100).map(lambda i: (i, float(i))),
        st.booleans().map(lambda b: (b, float(b))),
        _numpy_scalar().map(lambda p: (p[0], float(p[1]))),
        _numpy_scalar().map(lambda p: (np.array(p[0]), float(p[1]))),
        _numpy_scalar().map(lambda p: (np.array([p[0]]), float(p[1]))),
    ]
    if HAS_TORCH:
        import torch

        numbers.append(st.floats(width=32).map(lambda x: (torch.tensor(x), float(torch.tensor(x)))))
        numbers.append(st.integers(-(2**40), 2**40).map(lambda i: (torch.tensor(i), float(i))))
    return st.one_of(numbers)


_BAD_METRIC: st.SearchStrategy[Any] = st.one_of(
    st.text(max_size=5),
    st.sampled_from(["1.5", "nan", "", "0"]),
    st.none(),
    st.lists(st.floats(), max_size=3),
    hnp.arrays(np.float64, st.integers(2, 5)),
    st.complex_numbers(allow_nan=False),
    st.integers(2**1100, 2**1200),
    st.builds(Boom),
    st.builds(object),
    st.binary(max_size=3),
)


def _metric() -> st.SearchStrategy[tuple[Any, Any]]:
    """(value, float that must arrive, or None for a value that must be dropped)."""
    return st.one_of(_good_metric(), _good_metric(), _BAD_METRIC.map(lambda v: (v, None)))


_NAMES = st.sampled_from(["loss", "lr", "grad_norm", "acc", "grad_norm/fc1", "ü"])

_BAD_STEP: st.SearchStrategy[Any] = st.one_of(
    st.floats(),
    st.sampled_from(["3", None, True, False, np.bool_(True), np.float64(4.0), 2**63, -(2**63) - 1]),
)


def _dress_step(step: int) -> st.SearchStrategy[Any]:
    """``step`` as a Python int or a NumPy int that holds it."""
    kinds: list[Any] = [step, np.int64(step)]
    if 0 <= step < 2**32:
        kinds += [np.uint32(step), np.uint64(step)]
    if -(2**31) <= step < 2**31:
        kinds.append(np.int32(step))
    return st.sampled_from(kinds)


_REFUSED = object()  # the model's mark for a field value that must be dropped


def _field_leaf() -> st.SearchStrategy[tuple[Any, Any, int]]:
    """(value, what must arrive, number of drops it causes)."""
    good: list[st.SearchStrategy[tuple[Any, Any, int]]] = [
        st.none().map(lambda v: (v, v, 0)),
        st.booleans().map(lambda v: (v, v, 0)),
        st.floats().map(lambda v: (v, v, 0)),
        st.integers(-(2**63), 2**64 - 1).map(lambda v: (v, v, 0)),
        st.text(max_size=8).map(lambda v: (v, v, 0)),
        _numpy_scalar().map(lambda p: (p[0], p[1], 0)),
        hnp.arrays(st.sampled_from(_NUMERIC_DTYPES), hnp.array_shapes(min_dims=0, max_dims=2, max_side=3)).map(
            lambda a: (a, a.tolist(), 0)
        ),
    ]
    if HAS_TORCH:
        import torch

        good.append(
            st.lists(st.floats(width=32), max_size=4).map(lambda xs: (torch.tensor(xs), torch.tensor(xs).tolist(), 0))
        )
    bad = st.one_of(
        st.builds(object),
        st.builds(Boom),
        st.complex_numbers(allow_nan=False),
        st.integers(2**64, 2**70),
        st.binary(max_size=3),
        st.frozensets(st.integers(), max_size=2),
    ).map(lambda v: (v, _REFUSED, 1))
    return st.one_of(*good, bad)


def _field_tree() -> st.SearchStrategy[tuple[Any, Any, int]]:
    def containers(children: st.SearchStrategy[tuple[Any, Any, int]]) -> st.SearchStrategy[tuple[Any, Any, int]]:
        def as_list(items: list[tuple[Any, Any, int]], make: type) -> tuple[Any, Any, int]:
            return (
                make(v for v, _, _ in items),
                [None if e is _REFUSED else e for _, e, _ in items],
                sum(n for _, _, n in items),
            )

        def as_dict(items: dict[str, tuple[Any, Any, int]]) -> tuple[Any, Any, int]:
            return (
                {k: v for k, (v, _, _) in items.items()},
                {k: e for k, (_, e, _) in items.items() if e is not _REFUSED},
                sum(n for _, _, n in items.values()),
            )

        return st.one_of(
            st.lists(children, max_size=4).map(lambda xs: as_list(xs, list)),
            st.lists(children, max_size=3).map(lambda xs: as_list(xs, tuple)),
            st.dictionaries(st.text(max_size=4), children, max_size=4).map(as_dict),
        )

    return st.recursive(_field_leaf(), containers, max_leaves=8)


@st.composite
def _script(draw: st.DrawFn) -> dict[str, Any]:
    """A random training script: log() calls with good and bad steps and values, and event() calls."""
    calls: list[tuple[Any, dict[str, Any]]] = []
    rows: list[tuple[int, dict[str, Any]]] = []
    bad = {"bad_value": 0, "bad_step": 0, "bad_field": 0}
    steps = draw(st.lists(st.integers(-(2**63), 2**63 - 1), unique=True, max_size=40))
    for step in steps:
        metrics = draw(st.dictionaries(_NAMES, _metric(), max_size=4))
        if draw(st.integers(0, 9)) == 0:
            calls.append((draw(_BAD_STEP), {k: v for k, (v, _) in metrics.items()}))
            bad["bad_step"] += 1
            continue
        calls.append((draw(_dress_step(step)), {k: v for k, (v, _) in metrics.items()}))
        rows.append((step, {k: _canon(want) for k, (_, want) in metrics.items() if want is not None}))
        bad["bad_value"] += sum(want is None for _, want in metrics.values())
    events: list[tuple[Any, Any, dict[str, Any]]] = []
    expected_events: list[tuple[str, Any, Any]] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.one_of(st.text(max_size=6), st.integers(), st.just(np.int16(3))))
        event_step = draw(st.one_of(st.none(), st.integers(0, 2**40), _BAD_STEP))
        fields = draw(st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), _field_tree(), max_size=4))
        is_int = isinstance(event_step, int) and not isinstance(event_step, bool) and -(2**63) <= event_step < 2**63
        good_step = event_step if is_int else None
        bad["bad_step"] += event_step is not None and good_step is None
        bad["bad_field"] += sum(n for _, _, n in fields.values())
        events.append((kind, event_step, {k: v for k, (v, _, _) in fields.items()}))
        expected_fields = {k: e for k, (_, e, _) in fields.items() if e is not _REFUSED}
        kind_text = str(kind)  # an int kind can be longer than a name may be: cut and counted, as any long kind
        bad["bad_field"] += len(kind_text) > MAX_NAME
        expected_events.append((kind_text[:MAX_NAME], good_step, _canon(expected_fields)))
    return {"calls": calls, "rows": rows, "events": events, "expected_events": expected_events, "bad": bad}


@settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(script=_script())
def test_fuzz_every_well_formed_step_arrives_and_close_says_whether_anything_was_lost(
    broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, script: dict[str, Any]
) -> None:
    caplog.set_level(logging.WARNING, logger="trainvigil.agent")
    caplog.clear()
    agent = _agent(broker, tmp_path)
    for step, metrics in script["calls"]:
        agent.log(step, **metrics)
    for kind, step, fields in script["events"]:
        agent.event(kind, step=step, **fields)
    delivered = agent.close(timeout=20)
    want_drops = {k: n for k, n in script["bad"].items() if n}
    assert agent.stats()["dropped"] == want_drops
    assert delivered is (not want_drops)
    rows, events, _ = _arrived(broker, agent.run_id)
    assert sorted(rows, key=repr) == sorted(script["rows"], key=repr)
    assert [(e.kind, e.step, _canon(e.fields)) for e in events] == script["expected_events"]
    assert not _errors(caplog), "no value may reach the worker's last-resort error handling"


def test_init_config_goes_out_in_run_start_converted_and_what_cannot_is_named(broker: str, tmp_path: Path) -> None:
    """``trainvigil.init(config=...)``: how a run declares ``target_kl``/``val_metric``/``eval_metric``."""
    config = {"target_kl": np.float64(0.015), "layers": np.array([4, 8]), "name": "ppo", "opaque": object()}
    agent = trainvigil.init(run_id="declared", nats_url=broker, spill_dir=tmp_path, flush_interval=0.02, config=config)
    agent.log(0, loss=1.0)
    assert agent.close(timeout=10) is False, "a config value was left out: close() says something was lost"
    dropped = agent.stats()["dropped"]
    assert dropped == {"bad_field": 1}, dropped
    starts = [
        r
        for _, envelope in asyncio.run(_read_run(broker, "declared"))
        for r in envelope.records
        if isinstance(r, RunStart)
    ]
    assert [s.config for s in starts] == [{"target_kl": 0.015, "layers": [4, 8], "name": "ppo"}]
    assert type(starts[0].config["target_kl"]) is float
