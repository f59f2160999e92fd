"""The webhook queue cannot be starved: pages are never dropped to make room for warnings, updates of one
episode take one place (its newest state), and a flood from one run never crowds out another run's page.

Against a real HTTP receiver on 127.0.0.1 that hangs on its first post (the webhook is slow, so the queue
fills), through the sink itself and end to end through a real daemon and nats-server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import nats
import numpy as np
import pytest
from support import Daemon, NatsServer, wait_for
from webhook_server import HANG, hook_server

from trainvigil.daemon.alerts.webhook import WebhookSink
from trainvigil.daemon.config import AlertsConfig
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.schemas import Anomaly, Column, Envelope, Source, StepBatch, encode


def _alert(run_id: str, episode: str, severity: str = "page", state: str = "open", **fields: Any) -> Anomaly:
    values: dict[str, Any] = {
        "time": 1_700_000_000.0,
        "run_id": run_id,
        "rank": 0,
        "step": 7,
        "detector": "non_finite" if severity == "page" else "loss_spike",
        "severity": severity,
        "state": state,
        "episode": episode,
    }
    return Anomaly(**(values | fields))


def _sink(url: str = "http://127.0.0.1:9/x", **settings: Any) -> tuple[WebhookSink, DaemonMetrics]:
    metrics = DaemonMetrics()
    config = AlertsConfig(webhook_url=url, **{"backoff_s": 0.01, "timeout_s": 60.0, "retries": 1, **settings})
    return WebhookSink(config, metrics), metrics


async def _until(condition: Any, timeout: float, what: str) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)
    assert condition(), what


def test_a_page_is_posted_despite_a_flood_of_warnings_and_their_updates() -> None:
    """The webhook hangs on its first post; meanwhile a real page and 7 398 warning updates arrive (forged
    or real, one run's). The page goes out next once the webhook answers; the warnings take what is left."""
    with hook_server(HANG, 200) as hook:
        sink, metrics = _sink(hook.url, queue_size=10)

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                await tg.start(sink.serve)
                sink.offer(_alert("blocker", "b"))
                await _until(lambda: hook.count() == 1, 10, "the first post to hang")
                sink.offer(_alert("victim", "v"))
                for i in range(7398):
                    sink.offer(_alert("noisy", f"w{i % 40}", "warn", ("open", "escalated", "cleared")[i % 3]))
                hook.release.set()
                await _until(lambda: any(r["episode"] == "v" for r in hook.requests), 20, "the real page's post")
                await _until(lambda: metrics.webhook["sent"] == 11, 20, "the queue posted")
                await sink.drain()
                tg.cancel_scope.cancel()

        anyio.run(main, backend="asyncio")
    posted = [r["episode"] for r in hook.requests]
    assert posted.count("v") == 1 and posted[:3] == ["b", "b", "v"], "the hung post retried, then the page"
    assert metrics.webhook["dropped"] == 7398 - 9
    assert metrics.webhook_dropped == {"queue_full": 7398 - 9}, "only warnings were dropped"


def test_updates_of_one_episode_take_one_place_holding_the_newest_state() -> None:
    sink, metrics = _sink(queue_size=3)  # no worker: nothing leaves the queue
    sink.offer(_alert("r", "e", "warn", "open"))
    sink.offer(_alert("r", "other", "warn", "open"))
    sink.offer(_alert("r", "e", "page", "escalated"))
    sink.offer(_alert("r", "e", "page", "cleared"))
    assert [(a.episode, a.state) for a in sink.queued()] == [("e", "cleared"), ("other", "open")]
    assert metrics.webhook_dropped == {"superseded": 2} and metrics.webhook["dropped"] == 2


def test_a_full_queue_drops_a_warning_before_any_page_and_an_incoming_warning_before_a_queued_page() -> None:
    sink, metrics = _sink(queue_size=2)
    sink.offer(_alert("r", "w", "warn"))
    sink.offer(_alert("r", "p1"))
    sink.offer(_alert("r", "p2"))  # full: the warning goes
    sink.offer(_alert("r", "w2", "warn"))  # full of pages: the incoming warning goes
    assert [a.episode for a in sink.queued()] == ["p1", "p2"]
    assert metrics.webhook_dropped == {"queue_full": 2}


def test_a_full_queue_of_pages_drops_the_oldest_page_of_the_run_holding_the_most() -> None:
    sink, metrics = _sink(queue_size=4)
    sink.offer(_alert("victim", "v"))
    for i in range(50):
        sink.offer(_alert("flood", f"f{i}"))
    assert [a.episode for a in sink.queued()] == ["v", "f47", "f48", "f49"], "runs take turns; the newest kept"
    assert metrics.webhook_dropped == {"queue_full": 47}
    sink.offer(_alert("late", "l"))  # a run with none queued takes the place of the flood's oldest
    assert [a.episode for a in sink.queued()] == ["v", "f48", "l", "f49"]


def test_runs_take_turns_in_the_queue_pages_first() -> None:
    sink, _ = _sink(queue_size=10)
    for run_id, episode, severity in [("a", "a1", "page"), ("a", "a2", "page"), ("a", "aw", "warn")]:
        sink.offer(_alert(run_id, episode, severity))
    for run_id, episode, severity in [("b", "bw", "warn"), ("b", "b1", "page"), ("c", "c1", "page")]:
        sink.offer(_alert(run_id, episode, severity))
    assert [a.episode for a in sink.queued()] == ["a1", "b1", "c1", "a2", "aw", "bw"]


def _nan_steps(run_id: str, rank: int, world_size: int) -> bytes:
    """Ten steps of one rank whose loss is NaN at step 5: ``non_finite`` pages."""
    step = np.arange(10, dtype="<i8")
    loss = np.ones(10, dtype="<f8")
    loss[5] = np.nan
    times = 1.7e9 + step.astype("<f8")
    batch = StepBatch(
        time=float(times[-1]),
        step=step.tobytes(),
        times=times.tobytes(),
        columns={"loss": Column(values=loss.tobytes())},
    )
    return encode(Envelope(source=Source(run_id=run_id, rank=rank, world_size=world_size), seq=1, records=[batch]))


def _publish(url: str, run_id: str, ranks: int) -> None:
    async def main() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            for rank in range(ranks):
                await js.publish(f"vigil.v1.{run_id}.metrics", _nan_steps(run_id, rank, ranks))
        finally:
            await nc.close()

    asyncio.run(main())


def _pages(posts: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    return [p for p in posts if p["run_id"] == run_id and p["detector"] == "non_finite"]


def _drops_logged(daemon: Daemon) -> int:
    return daemon.log.read_text().count('"event": "alert_webhook_dropped"')


def test_a_flood_of_pages_from_one_run_never_crowds_out_another_runs_page(
    private_nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with hook_server(HANG, 200) as hook:
        settings = {"WEBHOOK_URL": hook.url, "TIMEOUT_S": "120", "QUEUE_SIZE": "20", "DRAIN_S": "5"}
        for key, value in settings.items():
            monkeypatch.setenv(f"VIGIL_ALERTS_{key}", value)
        daemon = Daemon(private_nats_server.url, tmp_path / "data")
        daemon.start()
        try:
            _publish(private_nats_server.url, "blocker", 1)
            wait_for(lambda: hook.count() == 1, 30, "the first page's post to hang")
            _publish(private_nats_server.url, "victim", 1)
            victim = "select count(*) from anomalies where run_id = 'victim' and detector = 'non_finite'"
            wait_for(lambda: daemon.scalar(victim) == 1, 30, "the victim's page")
            _publish(private_nats_server.url, "flood", 200)
            flood = "select count(*) from anomalies where run_id = 'flood' and detector = 'non_finite'"
            wait_for(lambda: daemon.scalar(flood) == 200, 60, "the flood's 200 pages")
            wait_for(lambda: _drops_logged(daemon) >= 180, 30, "the flood overflowing the queue")
            hook.release.set()
            wait_for(lambda: _pages(hook.requests, "victim"), 60, "the victim's page posted")
            assert daemon.terminate() == 0
        finally:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.kill()
    assert len(_pages(hook.requests, "victim")) == 1
