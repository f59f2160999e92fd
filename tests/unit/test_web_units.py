"""The web view's pure parts and its queries on a real DuckDB file, through the read-only query path;
the commit broadcaster; ``vigil plot`` without its extra."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.cli.main import main
from trainvigil.daemon.store.query import run_query
from trainvigil.daemon.store.writer import Store
from trainvigil.daemon.web import sql
from trainvigil.daemon.web.live import MIN_INTERVAL_S, Broadcaster
from trainvigil.schemas import Anomaly, RunEvent, Source


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


@pytest.mark.parametrize(
    ("bind", "host", "answered"),
    [
        ("127.0.0.1", "127.0.0.1:9464", True),
        ("127.0.0.1", "localhost", True),
        ("127.0.0.1", "[::1]:9464", True),
        ("127.0.0.1", "127.0.0.2", True),
        ("127.0.0.1", "localhost.", True),
        ("127.0.0.1", "10.0.0.1", False),
        ("127.0.0.1", "attacker.example:9464", False),
        ("127.0.0.1", "127.0.0.1.nip.io", False),
        ("127.0.0.1", "", False),
        ("10.0.0.5", "10.0.0.5:9464", True),
        ("10.0.0.5", "10.0.0.6", False),
        ("0.0.0.0", "192.168.1.20", True),
        ("::", "[fe80::1]", True),
        ("0.0.0.0", "attacker.example", False),
        ("vigil.internal", "vigil.internal:9464", True),
        ("vigil.internal", "VIGIL.internal.", True),
    ],
)
def test_a_host_is_answered_when_it_names_an_address_or_name_the_daemon_listens_on(
    bind: str, host: str, answered: bool
) -> None:
    from trainvigil.daemon.web.hosts import HostPolicy

    assert HostPolicy(bind).allows(host) is answered


def test_allowed_hosts_add_names_subdomains_or_every_name() -> None:
    from trainvigil.daemon.web.hosts import HostPolicy

    policy = HostPolicy("127.0.0.1", ["daemon", ".vigil.example", " "])
    assert [policy.allows(h) for h in ("daemon:9464", "vigil.example", "a.b.vigil.example")] == [True] * 3
    assert not any(policy.allows(h) for h in ("daemon.attacker.example", "xvigil.example", "vigil.example.evil"))
    assert HostPolicy("127.0.0.1", ["*"]).allows("anything.example")


def test_the_connection_cap_leaves_half_the_descriptors_and_the_accept_burst_fits_beside_it() -> None:
    from trainvigil.daemon.web.connections import MAX_CONNECTIONS, accept_backlog, connection_cap

    assert connection_cap(1024) == 512 and connection_cap(1_048_576) == MAX_CONNECTIONS
    for limit in (1024, 4096, 65536):
        cap = connection_cap(limit)
        assert cap + 2 * accept_backlog(cap) < limit - 64, limit


def test_commits_reach_subscribers_in_ticks_at_most_four_a_second_as_one_notice_naming_every_run() -> None:
    async def scenario() -> tuple[dict[str, object], float]:
        live = Broadcaster()
        live.bind()
        async with live.subscribe() as sub:
            first = IngestBatch(events=[(Source(run_id="a"), RunEvent(time=1.0, kind="eval"))])
            alert = Anomaly(time=1.0, run_id="b", rank=0, step=3, detector="d", severity="page")
            started = time.monotonic()
            await anyio.to_thread.run_sync(live.committed, first)  # the store calls it on its writer thread
            await anyio.to_thread.run_sync(live.committed, IngestBatch(anomalies=[alert]))
            with anyio.fail_after(5):
                while live.generation < 2:  # the first commit ticks at once, the next waits for the interval
                    await anyio.sleep(0.01)
            return sub.take(), time.monotonic() - started

    notice, took = anyio.run(scenario, backend="asyncio")
    assert notice["runs"] == ["a", "b"] and notice["alerts"] is True and notice["events"] is True
    assert took >= MIN_INTERVAL_S


def test_vigil_plot_without_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["plot", "r", "--data-dir", str(tmp_path), "--nats", "nats://127.0.0.1:1"]) == 3
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "vigil: plot needs matplotlib; install it with: pip install 'trainvigil[plot]'"
    )


def test_identical_queries_in_one_commit_generation_run_once_and_a_commit_runs_them_again() -> None:
    from trainvigil.daemon.web.cache import SharedAnswers

    generation, runs = [0], []

    async def scenario() -> list[int]:
        shared: SharedAnswers[int] = SharedAnswers(lambda: generation[0])
        gate = anyio.Event()

        async def run() -> int:
            runs.append(generation[0])
            await gate.wait()
            return len(runs)

        answers: list[int] = []

        async def ask() -> None:
            answers.append(await shared.get("q", run))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        generation[0] += 1
        answers.append(await shared.get("q", run))
        return answers

    assert anyio.run(scenario, backend="asyncio") == [1, 1, 1, 1, 1, 2]
    assert runs == [0, 1]


def _burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def _budget_run(busy: bool, requests: int, cost_s: float, share: float) -> tuple[float, int]:
    """Wall time for ``requests`` sequential requests of ``cost_s`` CPU each through an :class:`HttpBudget`."""
    from trainvigil.daemon.web.budget import HttpBudget

    async def app(scope: object, receive: object, send: object) -> None:
        _burn(cost_s)

    budget = HttpBudget(app, busy=lambda: busy, share=share, burst_s=0.0)

    async def scenario() -> float:
        started = time.monotonic()
        for _ in range(requests):
            await budget({"type": "http", "path": "/api/runs"}, None, None)  # type: ignore[arg-type]
        await budget({"type": "http", "path": "/healthz"}, None, None)  # type: ignore[arg-type]
        return time.monotonic() - started

    return anyio.run(scenario, backend="asyncio"), budget.held


def test_while_the_ingest_is_busy_requests_use_at_most_their_share_of_the_loop() -> None:
    took, held = _budget_run(busy=True, requests=10, cost_s=0.005, share=0.25)
    # Each request costs at least 5 ms; before the 10th may start, the budget (which starts empty) must
    # have refilled what the first 9 cost at a quarter of a core: 180 ms, however busy the machine is.
    assert took >= 0.99 * 9 * 0.005 / 0.25 and held > 0


def test_while_the_ingest_is_idle_requests_are_never_held() -> None:
    took, held = _budget_run(busy=False, requests=10, cost_s=0.005, share=0.25)
    assert held == 0 and took < 1.0


def test_the_ingest_counts_as_busy_only_while_committing_a_fleets_worth_of_steps_a_second() -> None:
    import numpy as np

    from trainvigil.daemon.batch.decode import StepColumns
    from trainvigil.daemon.web.live import HEAVY_STEPS_S

    def batch(steps: int) -> IngestBatch:
        ns = np.arange(steps)
        return IngestBatch(steps=[StepColumns(Source(run_id="r"), ns, ns.astype(float), {}, {})])

    async def scenario() -> list[bool]:
        live = Broadcaster()
        live.bind()
        seen = [live.busy()]
        # The writer thread hands its notice to the loop before its own return: both queue in order.
        await anyio.to_thread.run_sync(live.committed, batch(10))
        seen.append(live.busy())
        await anyio.to_thread.run_sync(live.committed, batch(HEAVY_STEPS_S))
        seen.append(live.busy())
        live.close()
        return seen

    assert anyio.run(scenario, backend="asyncio") == [False, False, True]
