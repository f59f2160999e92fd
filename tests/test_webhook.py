"""The webhook sink against a real local HTTP server: body, retries, timeouts, overflow, drain."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import anyio
import pytest
from hooks import HANG, hook_server

from trainvigil.daemon.alerts.webhook import WebhookSink, post_json, redact
from trainvigil.daemon.config import AlertsConfig
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.errors import ConfigError
from trainvigil.schemas import Anomaly


def _anomaly(episode: str = "non_finite:r:0:37", state: str = "open") -> Anomaly:
    return Anomaly(
        time=1_700_000_000.0,
        run_id="r",
        rank=0,
        step=37,
        detector="non_finite",
        severity="page",
        value=float("nan"),
        message="loss is nan at step 37: lower the LR",
        state=state,
        episode=episode,
    )


async def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)
    assert condition(), what


def _sink(url: str, **settings: float) -> tuple[WebhookSink, DaemonMetrics]:
    metrics = DaemonMetrics()
    config = AlertsConfig(webhook_url=url, **{"backoff_s": 0.01, "timeout_s": 5.0, **settings})  # type: ignore[arg-type]
    return WebhookSink(config, metrics), metrics


def _post_one(url: str, outcome: str, **settings: float) -> DaemonMetrics:
    """Offer one update to a running sink, wait for its ``outcome`` (sent or failed), drain."""
    sink, metrics = _sink(url, **settings)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(sink.serve)
            sink.offer(_anomaly())
            await _until(lambda: metrics.webhook[outcome] == 1, 20, outcome)
            await sink.drain()
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")
    return metrics


def test_a_posted_update_has_a_slack_text_and_every_anomaly_field() -> None:
    with hook_server(200) as hook:
        metrics = _post_one(hook.url, "sent")
    assert hook.count() == 1
    posted = hook.requests[0]
    assert posted["text"].startswith("2023-11-14 22:13:20 [PAGE] non_finite open on run r rank 0 step 37: loss is nan")
    assert posted["run_id"] == "r" and posted["step"] == 37 and posted["detector"] == "non_finite"
    assert posted["value"] == "NaN", "JSON has no NaN: it travels as the string vigil sql prints"
    assert posted["episode"] == "non_finite:r:0:37" and posted["state"] == "open" and posted["severity"] == "page"
    assert hook.headers[0]["Content-Type"] == "application/json"
    assert metrics.webhook == {"sent": 1}


def test_server_errors_are_retried_with_backoff_until_one_succeeds() -> None:
    with hook_server(503, 500, 200) as hook:
        metrics = _post_one(hook.url, "sent", retries=3)
    assert hook.count() == 3
    assert metrics.webhook == {"sent": 1, "retried": 2}


def test_a_client_error_is_not_retried_and_counts_as_failed() -> None:
    with hook_server(400) as hook:
        metrics = _post_one(hook.url, "failed", retries=3)
    assert hook.count() == 1
    assert metrics.webhook == {"failed": 1}


def test_a_hung_server_times_out_then_the_sink_retries_and_gives_up() -> None:
    with hook_server(HANG) as hook:
        metrics = _post_one(hook.url, "failed", timeout_s=0.3, retries=1)
        assert hook.count() == 2
    assert metrics.webhook == {"retried": 1, "failed": 1}


def test_a_refused_connection_is_retried_then_counted_as_failed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    metrics = _post_one(f"http://127.0.0.1:{port}/x", "failed", retries=2)
    assert metrics.webhook == {"retried": 2, "failed": 1}


def test_offer_never_waits_and_a_full_queue_drops_its_oldest_update() -> None:
    sink, metrics = _sink("http://127.0.0.1:9/x", queue_size=2)  # no worker: nothing leaves the queue
    for i in range(5):
        sink.offer(_anomaly(episode=f"e{i}"))
    assert metrics.webhook == {"dropped": 3}
    with sink._send, sink._receive:
        left = [sink._receive.receive_nowait().episode for _ in range(2)]
    assert left == ["e3", "e4"], "the newest updates are kept"


def test_drain_gives_a_hung_webhook_a_deadline_and_returns() -> None:
    with hook_server(HANG) as hook:
        sink, metrics = _sink(hook.url, timeout_s=60, drain_s=0.5)
        drained_after: list[float] = []

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                await tg.start(sink.serve)
                sink.offer(_anomaly(episode="a"))
                sink.offer(_anomaly(episode="b"))
                await _until(lambda: hook.count() == 1, 10, "the first post to hang")
                started = time.monotonic()
                await sink.drain()
                drained_after.append(time.monotonic() - started)
                tg.cancel_scope.cancel()

        anyio.run(main, backend="asyncio")
        sink.offer(_anomaly(episode="late"))
    assert hook.count() == 1
    assert 0.4 < drained_after[0] < 30, drained_after
    assert metrics.webhook == {"dropped": 1}, "an update after shutdown is dropped and counted"


def test_an_answer_that_is_not_http_is_an_error() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"SSH-2.0-not-http\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        with pytest.raises(OSError, match="not an HTTP answer"):
            anyio.run(post_json, f"http://127.0.0.1:{port}/", b"{}", 5.0, backend="asyncio")
        thread.join(5)


def test_webhook_url_must_be_http_and_is_redacted_in_logs() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        AlertsConfig(webhook_url="hooks.slack.com/services/T/B/secret")
    from trainvigil.daemon.config import load

    with pytest.raises(ConfigError, match="webhook_url"):
        load(env={"VIGIL_ALERTS_WEBHOOK_URL": "ftp://example.com/x"})
    assert load(env={"VIGIL_ALERTS_WEBHOOK_URL": "https://h.example/x", "VIGIL_ALERTS_RETRIES": "5"}).alerts == (
        AlertsConfig(webhook_url="https://h.example/x", retries=5)
    )
    assert redact("https://hooks.slack.com/services/T0/B0/secret") == "https://hooks.slack.com/..."
