"""A cardinality flood (many runs x ranks x metric names) through a real daemon: its per-run state is
forgotten once the runs went idle, and the memory goes back towards where it was before."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import numpy as np
import pytest
from cardinality import Flood, committed, forgetting_env, messages, publish, series, step_message
from fleet import AlertWatch
from support import Daemon, NatsServer, wait_for

from trainvigil.daemon import detectors
from trainvigil.daemon.batch.decode import Forgery, IngestBatch, StepColumns
from trainvigil.daemon.broker.ratelimit import Buckets
from trainvigil.daemon.config import load
from trainvigil.daemon.detectors import run_all
from trainvigil.daemon.detectors._lifecycle import IDLE_FORGET_MAX_S
from trainvigil.daemon.detectors._runner import SILENCE_MARGIN_S, forget_after_s
from trainvigil.daemon.ingest._forgery import REMEMBERED_RUNS, ForgeryPages
from trainvigil.daemon.metrics import RUNS_MAX, RunGauges
from trainvigil.daemon.web.cache import MAX_ENTRIES, SharedAnswers
from trainvigil.daemon.web.live import NOTICE_RUNS_MAX, Subscription, merged
from trainvigil.errors import ConfigError
from trainvigil.schemas import Anomaly, RunEnd, Source
from trainvigil.testing import memory_mib

IDLE_S = 6.0
FLOOD = Flood(runs=1000, ranks=20, names=20, prefix="card")
LIVE = "live-run"
ENV = {**forgetting_env(IDLE_S), "VIGIL_LOG_LEVEL": "warning"}


@pytest.fixture
def flooded_daemon(private_nats_server: NatsServer, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(private_nats_server.url, tmp_path / "data", env=ENV)
    d.start()
    yield d
    if d.process is not None and d.process.poll() is None:
        d.kill()


def _rss(d: Daemon) -> float:
    assert d.process is not None
    return memory_mib(d.process.pid, "VmRSS")


@pytest.mark.timeout(140)  # a flood, then its idle time-out and the RSS going back: ~46 s
@pytest.mark.slow
def test_a_flood_of_runs_is_forgotten_after_the_idle_time_out_and_a_live_run_still_pages(
    private_nats_server: NatsServer, flooded_daemon: Daemon
) -> None:
    """After the idle time-out the flood's /metrics series are gone and the RSS goes back towards its baseline;
    a run that kept logging keeps its series, and its NaN pages."""
    d = flooded_daemon
    url, port = private_nats_server.url, d.http_port
    live_step = 0

    def live(value: float = 1.0) -> None:
        nonlocal live_step
        live_step += 1
        asyncio.run(publish(url, [step_message(LIVE, 0, 1, live_step, time.time(), {"loss": value})]))

    live()
    wait_for(lambda: series(port, LIVE) > 0, 60, "the live run's gauges")
    baseline = _rss(d)
    asyncio.run(publish(url, messages(FLOOD, time.time())))
    wait_for(lambda: committed(port) >= FLOOD.messages + 1, 300, "every flood message to be committed", 0.5)
    flooded = _rss(d)
    assert series(port, FLOOD.prefix) > 0, "the flood's runs have gauges while they are live"

    def forgotten() -> bool:
        live()  # the live run keeps logging while the flood's runs stay silent
        return series(port, FLOOD.prefix) == 0

    wait_for(forgotten, IDLE_S * 10 + 60, "the flood's /metrics series to go", 0.5)
    assert series(port, LIVE) > 0, "a run that kept logging keeps its gauges"
    # The detectors forget on the same clock; the heap is trimmed when the ingest is next idle.
    added = flooded - baseline
    assert added > 30, f"the flood should cost memory to hold (baseline {baseline:.0f} MiB, flooded {flooded:.0f})"

    def returned() -> float | None:
        live()
        now = _rss(d)
        return now if now - baseline < 0.75 * added else None

    # Generous: the heap keeps some of what it handed out (fragments of live objects); without forgetting
    # and trimming it kept all of it.
    wait_for(returned, IDLE_S * 10 + 60, f"RSS to give back a quarter of the flood's {added:.0f} MiB", 1.0)
    with AlertWatch(url) as watch:
        live(float("nan"))
        wait_for(
            lambda: [a for _, a in watch.alerts() if a.run_id == LIVE and a.detector == "non_finite"],
            60,
            "the live run's NaN to page",
            0.2,
        )
    assert d.terminate() == 0


# ---- each bounded structure on plain data -------------------------------------------------------


def _steps(run_id: str, rank: int, step: int, t: float) -> StepColumns:
    one = np.ones(1)
    return StepColumns(
        source=Source(run_id=run_id, rank=rank),
        step=np.full(1, step, dtype=np.int64),
        times=np.full(1, t),
        known={"loss": (one, None)},
        custom={},
    )


def test_a_silent_stream_is_kept_until_the_silence_watchers_had_their_say() -> None:
    """idle_forget_s below run_failed's lost_after_s: the stream is kept until its lost page went out."""
    env = {
        **forgetting_env(5.0),
        "VIGIL_DETECTORS_RUN_FAILED_ENABLED": "true",
        "VIGIL_DETECTORS_RUN_FAILED_LOST_AFTER_S": "30",
    }
    dets = detectors.build(load(None, env=env).detectors)
    assert dets.runs.silent_forget_s == 30 + SILENCE_MARGIN_S
    run_all(dets, IngestBatch(steps=[_steps("quiet", 0, 1, 100.0)], now=100.0))
    pages: list[Anomaly] = []
    for t in range(101, 160):
        pages += run_all(dets, IngestBatch(now=float(t)))
    # stall paged the silence at 2 s; being lost escalates that episode (one page per dead rank)
    lost = [a for a in pages if a.detector == "run_failed" and a.state == "escalated"]
    assert [(a.run_id, a.severity) for a in lost] == [("quiet", "page")]
    assert dets.tracked() == dict.fromkeys(dets.tracked(), 0) and dets.forgotten == 1


def test_forget_after_is_the_idle_time_out_where_no_watcher_pages_later() -> None:
    env = {
        "VIGIL_DETECTORS_IDLE_FORGET_S": "900",
        "VIGIL_DETECTORS_RUN_FAILED_ENABLED": "false",
        "VIGIL_DETECTORS_STALL_MIN_SECONDS": "2",
    }
    assert detectors.build(load(None, env=env).detectors).runs.silent_forget_s == 900.0
    assert forget_after_s([], 5.0) == 5.0


def test_a_run_that_comes_back_after_it_was_forgotten_starts_fresh() -> None:
    dets = detectors.build(load(None, env={**forgetting_env(5.0)}).detectors)
    run_all(dets, IngestBatch(steps=[_steps("back", 0, 1, 100.0)], now=100.0))
    assert dets.tracked()["non_finite"] or dets.tracked()["stall"]
    run_all(dets, IngestBatch(now=130.0))
    assert len(dets.runs) == 0 and not any(dets.tracked().values())
    run_all(dets, IngestBatch(steps=[_steps("back", 0, 2, 131.0)], now=131.0))
    assert dets.runs.ranks("back") == [0]


def test_idle_forget_s_has_an_upper_bound() -> None:
    with pytest.raises(ConfigError, match="idle_forget_s"):
        load(None, env={"VIGIL_DETECTORS_IDLE_FORGET_S": str(IDLE_FORGET_MAX_S * 2)})
    assert load(None, env={"VIGIL_DETECTORS_IDLE_FORGET_S": str(IDLE_FORGET_MAX_S)})


def test_run_gauges_go_after_the_idle_time_out_and_an_ended_run_after_its_grace() -> None:
    gauges = RunGauges(most=RUNS_MAX, idle_s=10.0)
    ended = IngestBatch(steps=[_steps("ended", 0, 1, 0.0)], run_ends=[(Source(run_id="ended", rank=0), RunEnd(time=0))])
    gauges.observe(IngestBatch(steps=[_steps("silent", 0, 1, 0.0)]), 1000.0)
    gauges.observe(ended, 1000.0)
    assert len(gauges) == 2
    gauges.observe(IngestBatch(steps=[_steps("live", 0, 1, 0.0)]), 1011.0)
    assert len(gauges) == 1, "the silent run and the ended one went after the idle time-out"
    for k in range(RUNS_MAX * 3):
        gauges.observe(IngestBatch(steps=[_steps(f"r{k}", 0, 1, 0.0)]), 1012.0)
    assert len(gauges) == RUNS_MAX, "the series count is bounded however many runs are live"


def test_shared_answers_are_an_lru_of_their_documented_size() -> None:
    async def main() -> list[int]:
        answers: SharedAnswers[int] = SharedAnswers(lambda: 0, max_entries=2)
        ran: list[int] = []

        def run(k: int) -> Callable[[], Awaitable[int]]:
            async def go() -> int:
                ran.append(k)
                return k

            return go

        for k in (1, 2, 1, 3, 1, 2):
            await answers.get(k, run(k))
        return ran

    # 1 stays (used again before 3 came), 2 was the least recent when 3 came: asked again.
    assert anyio.run(main) == [1, 2, 3, 2]
    assert MAX_ENTRIES == 256


def test_forgery_pages_remember_a_bounded_number_of_runs() -> None:
    pages = ForgeryPages(per_hour=REMEMBERED_RUNS * 2)
    forged = [Forgery(subject="s", run_id=f"f{k}", kinds={"anomaly": 1}) for k in range(REMEMBERED_RUNS + 50)]
    assert len(pages.pages(forged, 1000.0)) == REMEMBERED_RUNS + 50
    assert len(pages._paged) == REMEMBERED_RUNS
    assert pages.pages([forged[0]], 1001.0), "the oldest run forgotten: it pages again if it comes back"


def test_rate_limit_buckets_are_bounded() -> None:
    now = [0.0]
    buckets = Buckets(rate=1.0, burst=5, most=3, clock=lambda: now[0])
    for k in range(100):
        buckets.take(f"inbox-{k}")
    assert len(buckets) <= 4  # the 3 tracked and the overflow bucket every new asker shares
    now[0] = 100.0
    buckets.take("late")
    assert len(buckets) == 1, "buckets left alone past their refill are forgotten"


def test_a_slow_page_behind_thousands_of_runs_is_told_every_run_not_each() -> None:
    sub = Subscription()
    for k in range(NOTICE_RUNS_MAX):
        sub.runs = merged(sub.runs, {f"r{k}"})
    assert sub.runs is not None and len(sub.runs) == NOTICE_RUNS_MAX
    sub.runs = merged(sub.runs, {"one-more"})
    assert sub.take()["runs"] is None, "past the bound the notice names every run (runs: null)"
    assert sub.runs == set() and merged(sub.runs, {"a"}) == {"a"}
