"""The web view's queries (``daemon/web/sql.py``) on a real DuckDB file, through the read-only query path:
quoted literals only, min/max buckets in DuckDB, non-finite values as points of their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainvigil.daemon.store.query import run_query
from trainvigil.daemon.store.writer import Store
from trainvigil.daemon.web import sql


def test_request_values_enter_sql_only_as_quoted_literals() -> None:
    assert sql.literal("it's") == "'it''s'"
    assert sql.metric_expr("loss") == "loss"
    assert sql.metric_expr("x'] IS NULL; --") == "extra['x''] IS NULL; --']"


def test_each_bucket_gives_its_min_and_max_in_step_order_and_a_one_step_bucket_one_point(tmp_path: Path) -> None:
    store = Store(tmp_path / "vigil.duckdb")
    try:
        store.con.execute(
            "INSERT INTO steps (run_id, rank, step, time, loss) SELECT 'p', 0, s, to_timestamp(100 + s), v "
            "FROM (VALUES (0, 5.0), (1, 1.0), (2, 2.0), (3, 9.0)) t(s, v)"
        )

        def series(n: int) -> dict[str, dict[str, list[int] | list[float]]]:
            result = run_query(store.cursor(), sql.run_series("p", "loss", [], None, None, n), sql.MAX_ROWS, 10)
            assert not result.error, result.error
            return sql.points(result.rows)

        # Two buckets: steps 0-1 (the maximum comes first) and 2-3, each its two points by step.
        assert series(2) == {"0": {"x": [0, 1, 2, 3], "y": [5.0, 1.0, 2.0, 9.0], "t": [100.0, 101.0, 102.0, 103.0]}}
        assert series(4)["0"]["x"] == [0, 1, 2, 3], "a bucket of one step is one point"
        assert series(1)["0"] == {"x": [1, 3], "y": [1.0, 9.0], "t": [101.0, 103.0]}
    finally:
        store.close()


def test_bucket_count_keeps_points_and_rows_in_budget() -> None:
    assert sql.bucket_count(1) * 2 <= sql.MAX_POINTS
    assert sql.bucket_count(64) * 64 <= sql.MAX_ROWS
    assert sql.bucket_count(10_000) >= 10


def test_non_finite_values_come_as_their_own_points_and_the_buckets_span_their_steps(tmp_path: Path) -> None:
    store = Store(tmp_path / "vigil.duckdb")
    try:
        store.con.execute(
            "INSERT INTO steps (run_id, rank, step, time, loss, extra) SELECT 'p', 0, s, to_timestamp(100 + s), v, "
            "MAP {'acc': v} FROM (VALUES (0, 1.0), (1, 'nan'::DOUBLE), (2, 2.0), (3, 'inf'::DOUBLE), "
            "(4, '-inf'::DOUBLE), (5, 'nan'::DOUBLE)) t(s, v)"
        )

        def series(metrics: list[str], n: int) -> dict[str, dict[str, dict[str, Any]]]:
            result = run_query(store.cursor(), sql.run_series_of("p", metrics, [], None, None, n), sql.MAX_ROWS, 10)
            assert not result.error, result.error
            return sql.points_by_metric(result.rows)

        for metric in ("loss", "acc"):  # a known column and a custom metric
            loss = series([metric], 6)[metric]["0"]
            assert (loss["x"], loss["y"]) == ([0, 2], [1.0, 2.0]), "finite values only in x and y"
            assert loss["nonfinite"] == {
                "x": [1, 3, 4, 5],
                "v": ["nan", "+inf", "-inf", "nan"],
                "t": [101.0, 103.0, 104.0, 105.0],
            }
        # One bucket of steps 0-5: the first step of each kind in it.
        assert series(["loss", "acc"], 1)["loss"]["0"]["nonfinite"]["x"] == [1, 3, 4]
        store.con.execute("UPDATE steps SET loss = 'nan'::DOUBLE")
        only = sql.points(run_query(store.cursor(), sql.run_series("p", "loss", [], None, None, 6), 100, 10).rows)
        assert only["0"]["x"] == [] and only["0"]["nonfinite"]["x"] == list(range(6)), "a series of NaNs still comes"
        finite = sql.points(run_query(store.cursor(), sql.run_series("p", "acc", [], 0, 0, 6), 100, 10).rows)
        assert finite == {"0": {"x": [0], "y": [1.0], "t": [100.0]}}, "a finite series has no nonfinite entry"
    finally:
        store.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "vigil.duckdb")
    s.con.execute(
        "INSERT INTO runs (run_id, first_seen, last_seen, world_size, status) VALUES ('r', now(), now(), 2, 'running')"
    )
    s.con.execute(
        "INSERT INTO steps (run_id, rank, step, time, loss, extra) SELECT 'r', rank, step, now(), "
        "CASE WHEN step = 777 THEN 50.0 ELSE 1.0 END, MAP {'acc': step / 10000} "
        "FROM range(2) t(rank), range(10000) s(step)"
    )
    yield s
    s.close()


def test_every_web_query_passes_the_read_only_check_and_runs(store: Store) -> None:
    for text in (
        sql.runs(),
        sql.run_info("r"),
        sql.episodes("r"),
        sql.events("r"),
        sql.anomalies(),
        sql.anomalies("r"),
        sql.compare_series(["r", "x'y"], "loss", [], None, None, 500),
        sql.run_series_of("r", ["loss", "acc", "x'] IS NULL; --"], [1], 5, 50, 100),
    ):
        result = run_query(store.cursor(), text, sql.MAX_ROWS, 10)
        assert not result.error, text


def test_a_series_is_bucketed_in_duckdb_keeping_its_extremes_and_a_zoom_gets_every_step(store: Store) -> None:
    n = sql.bucket_count(2)
    whole = sql.points(run_query(store.cursor(), sql.run_series("r", "loss", [], None, None, n), sql.MAX_ROWS, 10).rows)
    assert set(whole) == {"0", "1"}
    assert all(len(s["x"]) <= sql.MAX_POINTS for s in whole.values())
    assert 50.0 in whole["0"]["y"] and 777 in whole["0"]["x"]
    zoom = run_query(store.cursor(), sql.run_series("r", "acc", [1], 100, 199, n), sql.MAX_ROWS, 10)
    assert sql.points(zoom.rows)["1"]["x"] == list(range(100, 200))
    info = dict(zip(*[(r := run_query(store.cursor(), sql.run_info("r"), 10, 10)).columns, r.rows[0]], strict=True))
    assert (info["loss"], info["custom"], info["ranks"], info["last_step"]) == (20000, ["acc"], [0, 1], 9999)


def test_many_metrics_in_one_query_give_each_the_series_its_own_query_gives(store: Store) -> None:
    n = sql.bucket_count(2)
    many = run_query(
        store.cursor(), sql.run_series_of("r", ["loss", "acc", "absent"], [], 10, 5000, n), sql.MAX_ROWS, 10
    )
    assert not many.error, many.error
    by_metric = sql.points_by_metric(many.rows)
    assert set(by_metric) == {"loss", "acc"}, "a metric without values has no series"
    one = {
        m: sql.points(run_query(store.cursor(), sql.run_series("r", m, [], 10, 5000, n), sql.MAX_ROWS, 10).rows)
        for m in ("loss", "acc")
    }
    assert by_metric["acc"] == one["acc"]  # distinct values: the same points exactly
    # The loss's equal values tie, and a tie's step is DuckDB's pick: the same buckets and extremes.
    for rank in ("0", "1"):
        assert len(by_metric["loss"][rank]["x"]) == len(one["loss"][rank]["x"])
        assert 777 in by_metric["loss"][rank]["x"] and 50.0 in by_metric["loss"][rank]["y"]
