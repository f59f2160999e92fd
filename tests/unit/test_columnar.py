"""Columnar packing of logged steps (``agents/transport/columnar.py``): masks, bad values and steps counted,
chunks and splits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainvigil.agents.transport.columnar import Entry, StepBatchBuilder, build_step_batch, split_step_batch
from trainvigil.schemas import StepBatch


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
