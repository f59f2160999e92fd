"""The web view's pure parts and its queries on a real DuckDB file, through the read-only query path;
the commit broadcaster; ``vigil plot`` without its extra."""

from __future__ import annotations

import sys
import time
from pathlib import Path

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


def test_bucket_rows_become_step_ordered_series_and_a_one_point_bucket_one_point() -> None:
    rows = [(0, 0, 5, 1.0, 2, 9.0, 50.0, 20.0), (0, 1, 7, 3.0, 7, 3.0, 70.0, 70.0)]
    rows.append(("run", 0, 1, 2.0, 1, 2.0, None, None))
    assert sql.points(rows) == {
        "0": {"x": [2, 5, 7], "y": [9.0, 1.0, 3.0], "t": [20.0, 50.0, 70.0]},
        "run": {"x": [1], "y": [2.0], "t": [None]},
    }


def test_bucket_count_keeps_points_and_rows_in_budget() -> None:
    assert sql.bucket_count(1) * 2 <= sql.MAX_POINTS
    assert sql.bucket_count(64) * 64 <= sql.MAX_ROWS
    assert sql.bucket_count(10_000) >= 10


@pytest.fixture
def store(tmp_path: Path) -> Store:
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
        sql.compare_series(["r", "x'y"], "loss", None, None, 500),
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
    assert notice["runs"] == ["a", "b"] and notice["alerts"] is True
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
