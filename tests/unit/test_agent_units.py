"""The agent's pure parts (columnar packing, outbox, options) and its never-block/never-raise promise."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import wait_for

import trainvigil
from trainvigil.agents import Agent
from trainvigil.agents._alarm import Alarm
from trainvigil.agents.columnar import Entry, StepBatchBuilder, build_step_batch, split_step_batch
from trainvigil.agents.options import DEFAULT_NATS_URL, AgentOptions, resolve
from trainvigil.agents.outbox import Outbox, OutMsg, sealed_header
from trainvigil.errors import ConfigError
from trainvigil.schemas import StepBatch

# ---- columnar --------------------------------------------------------------------------------


def _steps(batch: StepBatch) -> list[int]:
    return np.frombuffer(batch.step, dtype="<i8").tolist()


def _times(batch: StepBatch) -> list[float]:
    return np.frombuffer(batch.times, dtype="<f8").tolist()


def _column(batch: StepBatch, name: str) -> list[float | None]:
    """A column as Python values, ``None`` where the presence mask says "not logged"."""
    col = batch.columns[name]
    values = np.frombuffer(col.values, dtype="<f8").tolist()
    assert len(values) == len(batch.step) // 8, f"column {name!r} length disagrees with step"
    if not col.present:
        return values
    assert len(col.present) == len(values)
    return [v if p else None for v, p in zip(values, col.present, strict=True)]


def _same(a: list[float | None], b: list[float | None]) -> bool:
    """Equal, treating NaN as equal to NaN."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            if x is not y:
                return False
        elif not (x == y or (math.isnan(x) and math.isnan(y))):
            return False
    return True


def _batch_view(batch: StepBatch) -> tuple[list[int], list[float], dict[str, list[float | None]]]:
    return _steps(batch), _times(batch), {name: _column(batch, name) for name in batch.columns}


def _assert_batches_equal(a: StepBatch, b: StepBatch) -> None:
    sa, ta, ca = _batch_view(a)
    sb, tb, cb = _batch_view(b)
    assert sa == sb
    assert ta == tb
    assert set(ca) == set(cb)
    for name in ca:
        assert _same(ca[name], cb[name]), name


def _mixed_entries(n: int) -> list[Entry]:
    """Every step has loss; lr every 3rd step; eval only at steps 100..109; bad value every 50th."""
    entries: list[Entry] = []
    for i in range(n):
        metrics: dict[str, object] = {"loss": 1.0 / (i + 1)}
        if i % 3 == 0:
            metrics["lr"] = 1e-3 * i
        if 100 <= i < 110:
            metrics["eval"] = float(i)
        if i % 50 == 7:
            metrics["grad_norm"] = "not a number"
        elif i % 2:
            metrics["grad_norm"] = float(i)
        entries.append((i, 1000.0 + i, metrics))
    return entries


def test_build_step_batch_of_nothing_is_none() -> None:
    batch, dropped = build_step_batch([], now=1.0)
    assert batch is None
    assert not dropped


def test_build_step_batch_packs_steps_times_and_full_columns_without_mask() -> None:
    entries: list[Entry] = [(i, 10.0 + i, {"loss": float(i), "lr": 0.1}) for i in range(5)]
    batch, dropped = build_step_batch(entries, now=99.0)
    assert batch is not None
    assert not dropped
    assert batch.time == 99.0
    assert _steps(batch) == [0, 1, 2, 3, 4]
    assert _times(batch) == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert set(batch.columns) == {"loss", "lr"}
    assert batch.columns["loss"].present == b""
    assert _column(batch, "loss") == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert _column(batch, "lr") == [0.1] * 5


def test_the_same_names_in_another_order_or_as_many_other_names_land_in_their_own_columns() -> None:
    """Rows with the same names in any order are read a column per name; as many names but other ones
    are not mistaken for the same (each name gets a mask where it is missing)."""
    same: list[Entry] = [(0, 0.0, {"loss": 1.0, "lr": 0.1}), (1, 0.0, {"lr": 0.2, "loss": 2.0})]
    batch, dropped = build_step_batch(same, now=0.0)
    assert batch is not None and not dropped
    assert (_column(batch, "loss"), _column(batch, "lr")) == ([1.0, 2.0], [0.1, 0.2])
    assert batch.columns["loss"].present == batch.columns["lr"].present == b""
    other: list[Entry] = [(0, 0.0, {"loss": 1.0, "lr": 0.1}), (1, 0.0, {"loss": 2.0, "acc": 0.5})]
    batch, dropped = build_step_batch(other, now=0.0)
    assert batch is not None and not dropped
    assert [_column(batch, n) for n in ("loss", "lr", "acc")] == [[1.0, 2.0], [0.1, None], [None, 0.5]]


def test_metric_missing_in_some_steps_gets_a_presence_mask() -> None:
    entries: list[Entry] = [(0, 0.0, {"loss": 1.0}), (1, 0.0, {"loss": 2.0, "acc": 0.5}), (2, 0.0, {"loss": 3.0})]
    batch, _ = build_step_batch(entries, now=0.0)
    assert batch is not None
    assert batch.columns["acc"].present == bytes([0, 1, 0])
    assert _column(batch, "acc") == [None, 0.5, None]
    assert batch.columns["loss"].present == b""


def test_nan_and_inf_are_kept_as_present_values() -> None:
    entries: list[Entry] = [
        (0, 0.0, {"loss": math.nan}),
        (1, 0.0, {"loss": math.inf}),
        (2, 0.0, {"loss": -math.inf}),
        (3, 0.0, {"loss": np.float32("nan")}),
    ]
    batch, dropped = build_step_batch(entries, now=0.0)
    assert batch is not None
    assert not dropped
    values = np.frombuffer(batch.columns["loss"].values, dtype="<f8").tolist()
    assert batch.columns["loss"].present == b""
    assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf and math.isnan(values[3])


def test_numpy_and_int_values_are_converted_to_float64() -> None:
    entries: list[Entry] = [(0, 0.0, {"a": np.float32(1.5), "b": 3, "c": np.int64(7), "d": True})]
    batch, dropped = build_step_batch(entries, now=0.0)
    assert batch is not None
    assert not dropped
    assert [_column(batch, n) for n in "abcd"] == [[1.5], [3.0], [7.0], [1.0]]


def test_string_values_become_null_and_are_counted_as_bad_value() -> None:
    entries: list[Entry] = [(0, 0.0, {"loss": 1.0}), (1, 0.0, {"loss": "oops"}), (2, 0.0, {"loss": [1, 2]})]
    batch, dropped = build_step_batch(entries, now=0.0)
    assert batch is not None
    assert dropped == {"bad_value": 2}
    assert _column(batch, "loss") == [1.0, None, None]


def test_column_with_only_bad_values_is_left_out() -> None:
    batch, dropped = build_step_batch([(0, 0.0, {"loss": 1.0, "tag": "x"})], now=0.0)
    assert batch is not None
    assert dropped == {"bad_value": 1}
    assert set(batch.columns) == {"loss"}


def test_none_value_is_null_and_counted_as_bad_value_not_a_nan() -> None:
    batch, dropped = build_step_batch([(0, 0.0, {"loss": 1.0}), (1, 0.0, {"loss": None})], now=0.0)
    assert batch is not None
    assert _column(batch, "loss") == [1.0, None]
    assert dropped == {"bad_value": 1}


@pytest.mark.parametrize("bad_step", [1.5, "3", None, True, np.float64(2.0)], ids=repr)
def test_non_int_steps_are_dropped_and_counted_as_bad_step(bad_step: object) -> None:
    entries: list[Entry] = [(0, 0.0, {"loss": 1.0}), (bad_step, 0.0, {"loss": 2.0}), (np.int32(2), 0.0, {"loss": 3.0})]
    batch, dropped = build_step_batch(entries, now=0.0)
    assert batch is not None
    assert dropped == {"bad_step": 1}
    assert _steps(batch) == [0, 2]
    assert _column(batch, "loss") == [1.0, 3.0]


def test_only_bad_steps_give_no_batch() -> None:
    batch, dropped = build_step_batch([("a", 0.0, {"loss": 1.0}), (None, 0.0, {})], now=0.0)
    assert batch is None
    assert dropped == {"bad_step": 2}


def test_steps_without_metrics_are_kept() -> None:
    batch, _ = build_step_batch([(0, 0.0, {}), (1, 0.0, {})], now=0.0)
    assert batch is not None
    assert _steps(batch) == [0, 1]
    assert batch.columns == {}


@pytest.mark.parametrize("chunk", [1, 7, 64, 256, 1000])
def test_chunked_add_equals_a_single_call(chunk: int) -> None:
    entries = _mixed_entries(600)
    single, single_dropped = build_step_batch(entries, now=5.0)
    builder = StepBatchBuilder()
    for lo in range(0, len(entries), chunk):
        builder.add(entries[lo : lo + chunk])
    chunked = builder.finish(5.0)
    assert single is not None and chunked is not None
    assert builder.rows == 600
    assert builder.dropped == single_dropped
    assert single_dropped["bad_value"] == 12
    _assert_batches_equal(chunked, single)


def test_chunked_add_with_bad_steps_equals_a_single_call() -> None:
    entries: list[Entry] = [(i if i % 4 else float(i), 0.0, {"loss": float(i)}) for i in range(40)]
    single, single_dropped = build_step_batch(entries, now=0.0)
    builder = StepBatchBuilder()
    for lo in range(0, 40, 6):
        builder.add(entries[lo : lo + 6])
    chunked = builder.finish(0.0)
    assert single is not None and chunked is not None
    assert builder.dropped == single_dropped == {"bad_step": 10}
    _assert_batches_equal(chunked, single)


def test_metric_only_in_the_first_chunk_keeps_the_batch_length() -> None:
    builder = StepBatchBuilder()
    builder.add([(0, 0.0, {"loss": 1.0}), (1, 0.0, {"loss": 2.0})])
    builder.add([(2, 0.0, {"lr": 0.1})])
    batch = builder.finish(0.0)
    assert batch is not None
    assert _column(batch, "loss") == [1.0, 2.0, None]


@pytest.mark.parametrize("parts", [1, 2, 3, 7, 600, 1000])
def test_split_step_batch_parts_reconcatenate_to_the_original(parts: int) -> None:
    batch, _ = build_step_batch(_mixed_entries(600), now=3.0)
    assert batch is not None
    pieces = list(split_step_batch(batch, parts))
    assert len(pieces) == min(parts, 600)
    assert all(len(p.step) > 0 for p in pieces)
    assert all(p.time == batch.time for p in pieces)
    steps = [s for p in pieces for s in _steps(p)]
    times = [t for p in pieces for t in _times(p)]
    assert steps == _steps(batch)
    assert times == _times(batch)
    for name in batch.columns:
        joined = [v for p in pieces for v in _column(p, name)]
        assert _same(joined, _column(batch, name)), name


# ---- alarm -----------------------------------------------------------------------------------


def test_an_alarm_sleeps_until_its_timeout_when_nobody_rings() -> None:
    async def main() -> float:
        alarm = Alarm()
        started = time.monotonic()
        await alarm.sleep(0.05)
        return time.monotonic() - started

    assert 0.045 <= asyncio.run(main()) < 5


def test_a_ring_from_another_thread_ends_the_sleep_early() -> None:
    async def main() -> float:
        alarm, loop = Alarm(), asyncio.get_running_loop()
        threading.Timer(0.05, loop.call_soon_threadsafe, (alarm.ring,)).start()
        started = time.monotonic()
        await alarm.sleep(30)
        return time.monotonic() - started

    assert asyncio.run(main()) < 10, "the ring ended a 30 s sleep"


def test_a_ring_before_the_sleep_is_kept_for_it_until_cleared() -> None:
    async def main() -> tuple[float, float]:
        alarm = Alarm()
        alarm.ring()
        started = time.monotonic()
        await alarm.sleep(30)  # at once: it rang before
        kept = time.monotonic() - started
        alarm.clear()
        started = time.monotonic()
        await alarm.sleep(0.05)  # the ring was taken and cleared: a full sleep
        return kept, time.monotonic() - started

    kept, cleared = asyncio.run(main())
    assert kept < 10 and cleared >= 0.045


# ---- outbox ----------------------------------------------------------------------------------


def _msg(i: int, payload_size: int = 20, events: int = 1) -> OutMsg:
    return OutMsg(subject="s.x", msg_id=f"id{i:03d}", payload=bytes([i % 256]) * payload_size, events=events)


def _drain(box: Outbox, per_round: int = 2) -> list[OutMsg]:
    out = []
    while len(box):
        got = box.peek(per_round)
        assert got, "peek returned nothing while messages are held"
        out += got
        box.pop(len(got))
    return out


def test_outbox_keeps_fifo_order_across_memory_spill_and_memory_again(tmp_path: Path) -> None:
    spill = tmp_path / "spill" / "agent.spill"
    box = Outbox(max_memory_bytes=3 * _msg(0).size, spill_path=spill, max_spill_bytes=10_000)
    for i in range(3):
        assert box.push(_msg(i))
    assert not spill.exists()
    assert box.spilled_bytes == 0
    for i in range(3, 8):
        assert box.push(_msg(i))
    assert spill.exists()
    assert box.spilled_bytes > 0
    assert box.memory_bytes == 3 * _msg(0).size
    first = box.peek(2)
    assert [m.msg_id for m in first] == ["id000", "id001"]
    box.pop(2)
    # Memory has room again, but order demands the new message goes behind the spilled ones.
    assert box.push(_msg(8))
    drained = first + _drain(box)
    assert [m.msg_id for m in drained] == [f"id{i:03d}" for i in range(9)]
    assert [m.payload for m in drained] == [_msg(i).payload for i in range(9)]
    assert not spill.exists()
    assert box.spilled_bytes == 0
    assert box.memory_bytes == 0
    # Drained: the next message goes to memory, not to a new spill file.
    assert box.push(_msg(9))
    assert not spill.exists()
    assert [m.msg_id for m in box.peek(5)] == ["id009"]


def test_outbox_to_disk_spills_while_memory_has_room_and_holds_in_memory_when_it_cannot_write(
    tmp_path: Path,
) -> None:
    box = Outbox(max_memory_bytes=10_000, spill_path=tmp_path / "a.live", max_spill_bytes=10_000)
    assert box.push(_msg(0), to_disk=True) and box.push(_msg(1))  # behind the spilled one: on disk too
    assert box.memory_bytes == 0 and box.pending_events == 2 and (tmp_path / "a.live").exists()
    assert [m.msg_id for m in _drain(box)] == ["id000", "id001"]
    (tmp_path / "file").touch()
    nowhere = Outbox(max_memory_bytes=10_000, spill_path=tmp_path / "file" / "a.live", max_spill_bytes=10_000)
    assert nowhere.push(_msg(2), to_disk=True)
    assert nowhere.memory_bytes == _msg(2).size and nowhere.spilled_bytes == 0
    assert [m.msg_id for m in _drain(nowhere)] == ["id002"]


def test_outbox_spill_round_trips_subject_id_payload_and_events(tmp_path: Path) -> None:
    box = Outbox(max_memory_bytes=0, spill_path=tmp_path / "a.spill", max_spill_bytes=10_000)
    msg = OutMsg(subject="vigil.v1.run-ü.metrics", msg_id="r/0/h/1/ü", payload=b"\x00\xff" * 50, events=42)
    assert box.push(msg)
    assert box.memory_bytes == 0
    assert box.peek(1) == [msg]


def test_outbox_peek_does_not_remove(tmp_path: Path) -> None:
    box = Outbox(max_memory_bytes=1000, spill_path=tmp_path / "a.spill", max_spill_bytes=1000)
    box.push(_msg(1))
    assert box.peek(3) == box.peek(3) == [_msg(1)]
    assert len(box) == 1


def test_outbox_push_returns_false_past_max_spill_bytes(tmp_path: Path) -> None:
    spill = tmp_path / "a.spill"
    size_on_disk = 16 + len("s.x") + len("id000") + 20
    box = Outbox(max_memory_bytes=0, spill_path=spill, max_spill_bytes=3 * size_on_disk)
    assert [box.push(_msg(i)) for i in range(5)] == [True, True, True, False, False]
    assert box.spilled_bytes == 3 * size_on_disk
    assert spill.stat().st_size == len(sealed_header("")) + 3 * size_on_disk  # a sealed file's header first
    assert box.pending_events == 3
    assert [m.msg_id for m in _drain(box)] == ["id000", "id001", "id002"]


def test_outbox_pending_events_counts_memory_and_spill(tmp_path: Path) -> None:
    box = Outbox(max_memory_bytes=2 * _msg(0).size, spill_path=tmp_path / "a.spill", max_spill_bytes=10_000)
    for i, events in enumerate([5, 7, 11, 13]):
        box.push(_msg(i, events=events))
    assert box.pending_events == 36
    assert box.spilled_bytes > 0
    box.peek(3)  # loads one message back from disk
    assert box.pending_events == 36
    box.pop(1)
    assert box.pending_events == 31
    box.pop(2)
    assert box.pending_events == 13
    box.peek(1)
    box.pop(1)
    assert box.pending_events == 0
    assert len(box) == 0


def test_outbox_discard_spill_forgets_disk_events_and_removes_the_file(tmp_path: Path) -> None:
    spill = tmp_path / "a.spill"
    box = Outbox(max_memory_bytes=_msg(0).size, spill_path=spill, max_spill_bytes=10_000)
    box.push(_msg(0, events=2))
    box.push(_msg(1, events=3))
    assert spill.exists()
    box.discard_spill()
    assert not spill.exists()
    assert box.pending_events == 2
    assert box.spilled_bytes == 0


# ---- options ---------------------------------------------------------------------------------


def test_resolve_reads_torchrun_rank_env_and_vigil_settings(tmp_path: Path) -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "VIGIL_RUN_ID": "my-run",
        "VIGIL_NATS_URL": "nats://broker:4222",
        "VIGIL_FLUSH_INTERVAL": "0.5",
        "VIGIL_BATCH_SIZE": "100",
        "VIGIL_SPILL_DIR": str(tmp_path),
    }
    opts, generated = resolve(None, None, None, {}, env)
    assert (opts.rank, opts.world_size, opts.local_rank) == (5, 8, 1)
    assert opts.run_id == "my-run"
    assert not generated
    assert opts.nats_url == "nats://broker:4222"
    assert opts.flush_interval == 0.5
    assert opts.batch_size == 100
    assert opts.spill_dir == tmp_path
    assert opts.enabled


def test_resolve_defaults_without_env() -> None:
    opts, generated = resolve(None, None, None, {}, {})
    assert (opts.rank, opts.world_size, opts.local_rank) == (0, 1, 0)
    assert opts.nats_url == DEFAULT_NATS_URL
    assert generated
    assert opts.run_id


def test_resolve_arguments_beat_env_and_overrides_beat_env() -> None:
    env = {"RANK": "5", "VIGIL_RUN_ID": "env-run", "VIGIL_NATS_URL": "nats://env:1", "VIGIL_BATCH_SIZE": "10"}
    opts, generated = resolve("arg-run", 2, "nats://arg:2", {"batch_size": 20}, env)
    assert (opts.run_id, opts.rank, opts.nats_url, opts.batch_size) == ("arg-run", 2, "nats://arg:2", 20)
    assert not generated


def test_resolve_unknown_option_raises_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="flush_intervall") as info:
        resolve("r", None, None, {"flush_intervall": 1.0}, {})
    assert info.value.key == "flush_intervall"


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "LOCAL_RANK"])
def test_resolve_bad_int_env_raises_config_error_naming_the_variable(name: str) -> None:
    with pytest.raises(ConfigError, match=name) as info:
        resolve("r", None, None, {}, {name: "two"})
    assert info.value.key == name


def test_resolve_bad_float_env_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="VIGIL_FLUSH_INTERVAL") as info:
        resolve("r", None, None, {}, {"VIGIL_FLUSH_INTERVAL": "fast"})
    assert info.value.key == "VIGIL_FLUSH_INTERVAL"


def test_resolve_bad_override_type_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="max_buffer"):
        resolve("r", None, None, {"max_buffer": "lots"}, {})


@pytest.mark.parametrize(("name", "value"), [("flush_interval", 0), ("batch_size", 0), ("close_timeout", -1)])
def test_options_reject_non_positive_settings(name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=name):
        overrides: dict[str, Any] = {name: value}
        AgentOptions(run_id="r", **overrides)


def test_options_reject_empty_run_id() -> None:
    with pytest.raises(ConfigError, match="run_id"):
        AgentOptions(run_id="")


def test_resolve_uses_torchelastic_run_id_when_world_size_above_one() -> None:
    opts, generated = resolve(None, None, None, {}, {"WORLD_SIZE": "4", "RANK": "3", "TORCHELASTIC_RUN_ID": "abc"})
    assert opts.run_id == "torchrun-abc"
    assert not generated


def test_resolve_vigil_run_id_beats_torchelastic_run_id() -> None:
    opts, _ = resolve(None, None, None, {}, {"WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "abc", "VIGIL_RUN_ID": "v"})
    assert opts.run_id == "v"


def test_resolve_multi_rank_without_torchelastic_shares_a_launcher_based_run_id() -> None:
    opts, generated = resolve(None, None, None, {}, {"WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"})
    assert opts.run_id.endswith(f"-{os.getppid()}")
    assert not generated


def test_resolve_vigil_disabled_turns_the_agent_off() -> None:
    opts, _ = resolve("r", None, None, {}, {"VIGIL_DISABLED": "1"})
    assert not opts.enabled


# ---- the agent without a broker --------------------------------------------------------------

_NO_BROKER = "nats://127.0.0.1:1"


@pytest.fixture
def offline_agent(tmp_path: Path) -> Iterator[Agent]:
    agent = trainvigil.init(run_id="offline", nats_url=_NO_BROKER, spill_dir=tmp_path / "spill", flush_interval=0.05)
    try:
        yield agent
    finally:
        agent.close(timeout=0.1)


def test_log_with_bad_values_and_steps_never_raises_and_counts_drops(offline_agent: Agent) -> None:
    offline_agent.log(0, loss="not a number")  # type: ignore[arg-type]
    offline_agent.log(1, loss=None)  # type: ignore[arg-type]
    offline_agent.log("two", loss=2.0)  # type: ignore[arg-type]
    offline_agent.log(3.5, loss=3.0)  # type: ignore[arg-type]
    offline_agent.log(4, loss=object(), grad_norm=1.0)  # type: ignore[arg-type]
    offline_agent.event("eval", step=None, acc=0.5)
    assert offline_agent.close(timeout=0.5) is False
    dropped = offline_agent.stats()["dropped"]
    assert dropped["bad_step"] == 2
    assert dropped["bad_value"] >= 2
    assert dropped["close_timeout"] >= 1


def test_ten_thousand_log_calls_never_block_without_a_broker(offline_agent: Agent) -> None:
    longest = 0.0
    clock = time.perf_counter
    for step in range(10_000):
        t0 = clock()
        offline_agent.log(step, loss=1.0 / (step + 1), lr=1e-3)
        longest = max(longest, clock() - t0)
    assert longest < 0.05, f"slowest log() took {longest * 1000:.1f} ms"


def test_log_wakes_an_agent_thread_asleep_through_a_quiet_spell_at_any_moment_of_it(tmp_path: Path) -> None:
    """Once no step came for a flush interval, the agent's thread sleeps until a heartbeat is due (an hour here)
    and the next ``log()`` wakes it. Steps logged at every moment of that hand-over (as it falls asleep, asleep,
    just after a flush) are each packed within the deadline, never left for the heartbeat."""
    agent = trainvigil.init(
        run_id="quiet", nats_url=_NO_BROKER, spill_dir=tmp_path / "spill", flush_interval=0.02, heartbeat_interval=3600
    )
    rng = random.Random(0)
    asleep = 0
    try:
        for step in range(40):
            time.sleep(rng.uniform(0.0, 0.05))  # the loop's pace, around the flush interval: part of the setup
            asleep += agent._wake_at == 0  # the thread said: wake me at the next step
            agent.log(step, loss=1.0)
            wait_for(lambda: not agent._steps, 5, f"step {step} to be packed")
    finally:
        agent.close(timeout=0.1)
    assert asleep >= 8, f"the thread slept through a quiet spell before only {asleep} of 40 steps"


def test_close_without_a_broker_returns_false_within_deadline_and_counts_close_timeout(offline_agent: Agent) -> None:
    for step in range(100):
        offline_agent.log(step, loss=1.0)
    t0 = time.monotonic()
    delivered = offline_agent.close(timeout=0.5)
    elapsed = time.monotonic() - t0
    assert delivered is False
    assert elapsed < 3.0
    stats = offline_agent.stats()
    assert stats["connected"] is False
    assert stats["dropped"]["close_timeout"] >= 100
    assert stats["delivered_events"] == 0
    # Closing twice is safe and gives the same answer.
    assert offline_agent.close(timeout=0.5) is False


def test_log_after_close_is_dropped_as_closed_without_raising(offline_agent: Agent) -> None:
    offline_agent.close(timeout=0.2)
    offline_agent.log(1, loss=1.0)
    offline_agent.event("late")
    assert offline_agent.stats()["dropped"]["closed"] == 2


def test_disabled_agent_is_a_no_op(tmp_path: Path) -> None:
    agent = trainvigil.init(run_id="off", nats_url=_NO_BROKER, enabled=False, spill_dir=tmp_path)
    agent.log(0, loss=1.0)
    agent.event("x")
    assert agent.close(timeout=0.1) is True
    assert agent.stats()["connected"] is False


@pytest.mark.parametrize(
    ("raised", "status"),
    [(None, "ok"), (KeyboardInterrupt, "ok"), (ValueError, "error")],
    ids=["clean", "ctrl-c", "crash"],
)
def test_leaving_the_with_block_ends_the_run_as_ok_unless_it_crashed(
    offline_agent: Agent, monkeypatch: pytest.MonkeyPatch, raised: type[BaseException] | None, status: str
) -> None:
    """Ctrl-C (or a canary runner's SIGINT) stops a run; only a real exception makes it an error (run_failed)."""
    closes: list[tuple[str, str]] = []
    worker = offline_agent._worker
    assert worker is not None
    real = worker.request_close

    def recording_close(timeout: float, st: str, crash: str) -> None:
        closes.append((st, crash))
        return real(timeout, st, crash)

    monkeypatch.setattr(worker, "request_close", recording_close)
    with pytest.raises(raised) if raised else contextlib.nullcontext(), offline_agent:
        if raised:
            raise raised("stop")
    assert closes and closes[0][0] == status
    assert bool(closes[0][1]) is (status == "error")
