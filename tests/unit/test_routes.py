"""The daemon's HTTP answers (``daemon/web/routes.py``) from its real ASGI app, in process: metrics, health, errors."""

from __future__ import annotations

import anyio
import httpx
import pytest

from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.daemon.web.routes import build_app


def _request(metrics: DaemonMetrics, path: str, method: str = "GET") -> httpx.Response:
    """One request to the daemon's real ASGI app, in process."""

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app=build_app(metrics))
        async with httpx.AsyncClient(transport=transport, base_url="http://vigil") as client:
            return await client.request(method, path)

    return anyio.run(ask, backend="asyncio")


def test_metrics_endpoint_serves_prometheus_text() -> None:
    metrics = DaemonMetrics()
    metrics.events_ingested["steps"] += 40
    metrics.events_ingested["heartbeat"] += 2
    metrics.dead_letters["malformed"] += 3
    metrics.consumer_lag = 17
    metrics.last_commit = 1795000000.25
    metrics.batch_write_seconds.observe(0.003)
    response = _request(metrics, "/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.text
    assert 'vigil_events_ingested_total{kind="steps"} 40' in text
    assert 'vigil_events_ingested_total{kind="heartbeat"} 2' in text
    assert "vigil_consumer_lag 17" in text
    assert "vigil_last_commit_timestamp_seconds 1.79500000025e+09" in text  # prometheus_client writes Go's floats
    assert 'vigil_dead_letters_total{reason="malformed"} 3' in text
    assert 'vigil_batch_write_seconds_bucket{le="0.0025"} 0' in text
    assert 'vigil_batch_write_seconds_bucket{le="0.005"} 1' in text
    assert 'vigil_batch_write_seconds_bucket{le="+Inf"} 1' in text
    assert "# TYPE vigil_batch_write_seconds histogram" in text
    assert text.endswith("\n")


def test_healthz_is_200_when_the_broker_is_connected() -> None:
    metrics = DaemonMetrics(broker_connected=True, last_seq=42, consumer_lag=3)
    response = _request(metrics, "/healthz")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    assert response.json() == {"status": "ok", "broker_connected": True, "last_seq": 42, "consumer_lag": 3}


def test_healthz_is_503_when_the_broker_is_disconnected() -> None:
    response = _request(DaemonMetrics(), "/healthz?verbose=1")
    assert response.status_code == 503
    assert response.json()["status"] == "degraded"


def test_unknown_path_is_404() -> None:
    response = _request(DaemonMetrics(), "/favicon.ico")
    assert response.status_code == 404
    assert "/healthz" in response.text


@pytest.mark.parametrize(("method", "path"), [("POST", "/metrics"), ("DELETE", "/healthz")])
def test_other_methods_are_405(method: str, path: str) -> None:
    assert _request(DaemonMetrics(), path, method).status_code == 405


def test_head_request_gets_the_get_headers_without_a_body() -> None:
    metrics = DaemonMetrics()
    head = _request(metrics, "/metrics", "HEAD")
    assert head.status_code == 200 and head.content == b""
    get = _request(metrics, "/metrics")
    assert int(head.headers["Content-Length"]) == len(get.content)
