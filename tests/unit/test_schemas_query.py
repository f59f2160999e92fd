"""Query answers on the wire (``schemas/query.py``): split into parts under a size, joined back unchanged."""

from __future__ import annotations

import msgspec
import pytest

from trainvigil.schemas.query import QueryResult, join_results, split_result


def _big_result(n: int = 20_000) -> QueryResult:
    return QueryResult(
        columns=["i", "s", "f", "n"],
        types=["BIGINT", "VARCHAR", "DOUBLE", "INTEGER"],
        rows=[[i, "x" * (i % 97), i * 0.25, None] for i in range(n)],
        truncated=True,
    )


def _encoded_size(result: QueryResult) -> int:
    return len(msgspec.msgpack.encode(result))


@pytest.mark.parametrize("max_bytes", [1000, 4096, 65536])
def test_split_result_parts_join_back_to_the_original(max_bytes: int) -> None:
    result = _big_result()
    parts = split_result(result, max_bytes)
    assert len(parts) > 1
    assert [p.more for p in parts] == [True] * (len(parts) - 1) + [False]
    assert all(not p.truncated for p in parts[:-1]) and parts[-1].truncated
    assert all(p.columns == result.columns and p.types == result.types for p in parts)
    # Every part's rows fit the budget; the envelope around them adds a fixed, small overhead
    # (plus up to 4 bytes as the rows array header grows from fixarray to array32).
    overhead = _encoded_size(msgspec.structs.replace(result, rows=[], more=True)) + 4
    assert all(_encoded_size(p) <= max_bytes + overhead for p in parts)
    decoded = [msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=QueryResult) for p in parts]
    assert join_results(decoded) == result


@pytest.mark.parametrize("max_bytes", [300, 1000, 4096, 65536])
def test_split_result_every_encoded_part_stays_under_max_bytes(max_bytes: int) -> None:
    """The whole encoded part fits, columns/types/flags included, not just its rows."""
    parts = split_result(_big_result(), max_bytes)
    assert len(parts) > 1
    assert all(_encoded_size(p) <= max_bytes for p in parts)


def test_split_result_of_a_small_or_empty_result_is_one_part() -> None:
    small = QueryResult(columns=["a"], types=["INTEGER"], rows=[[1]])
    assert split_result(small, 1 << 20) == [small]
    empty = QueryResult(error="refused", refused=True)
    assert split_result(empty, 100) == [empty]
    assert join_results([empty]) == empty


def test_split_result_never_splits_a_row_larger_than_the_limit() -> None:
    result = QueryResult(columns=["s"], types=["VARCHAR"], rows=[["a"], ["b" * 5000], ["c"]])
    parts = split_result(result, 1000)
    assert [p.rows for p in parts] == [[["a"]], [["b" * 5000]], [["c"]]]
    assert join_results(parts) == result
