"""Alerts end to end: a real training process, nats-server, daemon, DuckDB file and webhook receiver."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import duckdb
import msgspec
import nats
import pytest
from follower import Follower
from nats.aio.msg import Msg
from support import HERE, Daemon, NatsServer, finish, vigil, wait_for
from webhook_server import HANG, hook_server

from trainvigil.schemas import DEFAULT_SUBJECTS, Anomaly, Envelope, Source, decode, encode

NAN_STEP = 60
STEPS = NAN_STEP + 30  # fewer than non_finite's cooldown (50) after the NaN: the episode stays open


def _train(url: str, run_id: str, steps: int, *nan_at: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "nan_train.py"), run_id, str(steps), "--nan-at", *map(str, nan_at)],
        env={**os.environ, "VIGIL_NATS_URL": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


_vigil = functools.partial(vigil, timeout=60)


def _metric(daemon: Daemon, prefix: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.http_port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


def test_a_nan_at_step_n_yields_one_non_finite_alert_one_row_and_one_webhook_post(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with hook_server(200) as hook:
        monkeypatch.setenv("VIGIL_ALERTS_WEBHOOK_URL", hook.url)
        daemon = Daemon(nats_server.url, tmp_path / "data")
        received: list[tuple[str, Anomaly]] = []

        async def scenario() -> None:
            nc = await nats.connect(nats_server.url)

            async def on_alert(msg: Msg) -> None:
                received.extend((msg.subject, r) for r in decode(msg.data).records if isinstance(r, Anomaly))

            await nc.subscribe("vigil.v1.alerts.>", cb=on_alert)
            await nc.flush()
            await asyncio.to_thread(daemon.start)
            await asyncio.to_thread(finish, _train(nats_server.url, "nan-run", STEPS, NAN_STEP))
            await asyncio.to_thread(
                wait_for,
                lambda: daemon.scalar("select count(*) from steps where run_id = 'nan-run'") == STEPS,
                60,
                "every step committed",
            )
            listed = await asyncio.to_thread(
                _vigil, "alerts", "--run", "nan-run", "--nats", nats_server.url, "--format", "json"
            )
            assert listed.returncode == 0, listed.stderr
            rows = [msgspec.json.decode(line) for line in listed.stdout.splitlines()]
            assert [(r["detector"], r["step"], r["state"]) for r in rows if r["detector"] == "non_finite"] == [
                ("non_finite", NAN_STEP, "open")
            ]
            await asyncio.to_thread(
                wait_for, lambda: _metric(daemon, 'vigil_alert_webhook_total{outcome="sent"}') >= 1, 30, "the POST"
            )
            assert _metric(daemon, 'vigil_anomalies_total{detector="non_finite",severity="page",state="open"}') == 1
            # SIGTERM: the daemon commits, publishes and flushes everything before it exits.
            assert await asyncio.to_thread(daemon.terminate) == 0
            await nc.flush()
            await nc.close()

        asyncio.run(scenario())
        posts = [p for p in hook.requests if p["detector"] == "non_finite"]

    non_finite = [(subject, a) for subject, a in received if a.detector == "non_finite"]
    assert len(non_finite) == 1, received
    subject, alert = non_finite[0]
    assert subject == DEFAULT_SUBJECTS.alert("nan-run") == "vigil.v1.alerts.nan-run"
    assert (alert.run_id, alert.rank, alert.step, alert.severity, alert.state) == (
        "nan-run",
        0,
        NAN_STEP,
        "page",
        "open",
    )
    assert "nan" in alert.message and "checkpoint" in alert.message, "the message says what to do next"

    with duckdb.connect(str(daemon.data_dir / "vigil.duckdb"), read_only=True) as con:
        rows = con.execute(
            "select run_id, rank, step, severity, state, episode from anomalies where detector = 'non_finite'"
        ).fetchall()
    assert rows == [("nan-run", 0, NAN_STEP, "page", "open", alert.episode)]

    assert len(posts) == 1, hook.requests
    assert posts[0]["step"] == NAN_STEP and posts[0]["episode"] == alert.episode
    assert "[PAGE] non_finite open on run nan-run rank 0 step 60" in posts[0]["text"]


def test_a_hung_webhook_never_stalls_ingest(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with hook_server(HANG) as hook:
        for key, value in {"WEBHOOK_URL": hook.url, "TIMEOUT_S": "120", "QUEUE_SIZE": "1", "DRAIN_S": "0.5"}.items():
            monkeypatch.setenv(f"VIGIL_ALERTS_{key}", value)
        daemon = Daemon(nats_server.url, tmp_path / "data")
        daemon.start()
        try:
            finish(_train(nats_server.url, "first", 60, 20))
            wait_for(lambda: hook.count() == 1, 30, "the first alert's POST to hang")
            # The webhook now hangs for 120 s; a second run's steps and alerts still go through.
            finish(_train(nats_server.url, "second", 300, 20, 120, 220))
            wait_for(
                lambda: daemon.scalar("select count(*) from steps where run_id = 'second'") == 300, 60, "the second run"
            )
            episodes = daemon.sql(
                "select step from anomalies where run_id = 'second' and detector = 'non_finite' order by step"
            ).rows
            assert episodes == [[20], [120], [220]]
            updates = _metric(daemon, "vigil_anomalies_total{")
            assert updates >= 6, "open@20 (first); open, cleared, open, cleared, open (second)"
            # One update hangs in the POST, one waits in the queue (size 1), the rest were dropped.
            wait_for(
                lambda: _metric(daemon, 'vigil_alert_webhook_total{outcome="dropped"}') == updates - 2,
                10,
                "drops counted",
            )
            assert hook.count() == 1 and _metric(daemon, 'vigil_alert_webhook_total{outcome="sent"}') == 0
            assert daemon.terminate() == 0, "shutdown waits drain_s for the webhook, not its 120 s timeout"
        finally:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.kill()
    assert "alert_webhook_dropped" in daemon.log.read_text()


def test_vigil_alerts_follow_prints_each_update_of_its_run_until_ctrl_c(nats_server: NatsServer) -> None:
    with Follower("--run", "mine", "--format", "json", "--nats", nats_server.url) as follower:
        assert "following vigil.v1.alerts.mine" in follower.following(timeout=30)

        async def publish() -> None:
            nc = await nats.connect(nats_server.url)
            for run_id, state in [("other", "open"), ("mine", "open"), ("mine", "cleared")]:
                alert = Anomaly(
                    time=1.0, run_id=run_id, rank=1, step=7, detector="grad_spike", severity="warn", state=state
                )
                envelope = Envelope(source=Source(run_id=run_id), records=[alert])
                await nc.publish(DEFAULT_SUBJECTS.alert(run_id), encode(envelope))
            await nc.flush()
            await nc.close()

        asyncio.run(publish())
        got = [follower.next_alert(timeout=30) for _ in range(2)]
        assert [(g["run_id"], g["state"], g["detector"], g["step"]) for g in got] == [
            ("mine", "open", "grad_spike", 7),
            ("mine", "cleared", "grad_spike", 7),
        ]
        assert follower.stop() == 0
    assert follower.out.empty(), "the other run's alert was not printed"


def test_vigil_alerts_follow_without_a_broker_says_what_to_do() -> None:
    from trainvigil.daemon.broker.embedded import free_port

    followed = _vigil("alerts", "--follow", "--nats", f"nats://127.0.0.1:{free_port()}")
    assert followed.returncode == 3 and "no broker answered" in followed.stderr and "vigil up" in followed.stderr
