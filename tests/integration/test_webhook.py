"""The webhook sink against a real local HTTP server: body, signatures, retries, timeouts, overflow, drain;
and end to end, hostile alert text and a failing webhook through a real daemon, agent and nats-server."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import structlog
from support import Daemon, NatsServer, wait_for
from webhook_server import HANG, HookServer, hook_server

from trainvigil.daemon.alerts.webhook import WebhookSink, post_json, redact, webhook_client
from trainvigil.daemon.config import AlertsConfig, load
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.errors import ConfigError
from trainvigil.schemas import Anomaly

SECURITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "operations" / "security.md"


def _hostile(url: str) -> str:
    """Header injection (CR/LF, a second request), JSON breaking (a quote, a brace, a backslash), ``url``."""
    return f'"}}\r\nX-Injected: yes\r\nLocation: {url}\r\n\r\nPOST {url} HTTP/1.1\n\u2028</script>\\'


def _anomaly(episode: str = "non_finite:r:0:37", state: str = "open", **fields: Any) -> Anomaly:
    values: dict[str, Any] = {
        "time": 1_700_000_000.0,
        "run_id": "r",
        "rank": 0,
        "step": 37,
        "detector": "non_finite",
        "severity": "page",
        "value": float("nan"),
        "message": "loss is nan at step 37: lower the LR",
        "state": state,
        "episode": episode,
    }
    return Anomaly(**(values | fields))


def _readme_verify() -> Callable[..., bool]:
    """The receiver's ``verify`` exactly as the docs print it, so the documented check is the tested one."""
    section = SECURITY_DOC.read_text().split("## Securing the webhook and HTTP endpoint", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "docs/operations/security.md: the receiver snippet"
    scope: dict[str, Any] = {}
    exec(code.group(1), scope)
    verify: Callable[..., bool] = scope["verify"]
    return verify


def _secret_files(tmp_path: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """Fresh secrets in 0600 files: ``secret`` (signing), ``token`` (webhook bearer), ``http`` (the HTTP token)."""
    values = {
        "secret": "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode(),
        "token": secrets.token_urlsafe(32),
        "http": secrets.token_urlsafe(32),
    }
    files = {}
    for name, value in values.items():
        files[name] = tmp_path / f"{name}.secret"
        files[name].write_text(value + "\n")
        files[name].chmod(0o600)
    return values, files


def _headers(hook: HookServer, n: int) -> dict[str, str]:
    return {k.lower(): v for k, v in hook.headers[n].items()}


def _strict_json(body: bytes) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(body.decode("ascii"), parse_constant=refuse)


async def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)
    assert condition(), what


def _sink(url: str, **settings: Any) -> tuple[WebhookSink, DaemonMetrics]:
    metrics = DaemonMetrics()
    config = AlertsConfig(webhook_url=url, **{"backoff_s": 0.01, "timeout_s": 5.0, **settings})
    return WebhookSink(config, metrics), metrics


def _post(url: str, outcome: str, *anomalies: Anomaly, **settings: Any) -> DaemonMetrics:
    """Offer updates to a running sink, wait until that many reached ``outcome`` (sent or failed), drain."""
    sink, metrics = _sink(url, **settings)
    updates = anomalies or (_anomaly(),)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(sink.serve)
            for anomaly in updates:
                sink.offer(anomaly)
            await _until(lambda: metrics.webhook[outcome] == len(updates), 20, outcome)
            await sink.drain()
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")
    return metrics


def test_a_posted_update_has_a_slack_text_and_every_anomaly_field() -> None:
    with hook_server(200) as hook:
        metrics = _post(hook.url, "sent")
    assert hook.count() == 1
    posted = hook.requests[0]
    assert posted["text"].startswith("2023-11-14 22:13:20 [PAGE] non_finite open on run r rank 0 step 37: loss is nan")
    assert posted["run_id"] == "r" and posted["step"] == 37 and posted["detector"] == "non_finite"
    assert posted["value"] == "NaN", "JSON has no NaN: it travels as the string vigil sql prints"
    assert posted["episode"] == "non_finite:r:0:37" and posted["state"] == "open" and posted["severity"] == "page"
    assert hook.headers[0]["Content-Type"] == "application/json"
    assert not {"authorization", "webhook-signature"} & set(_headers(hook, 0)), "no credentials unless configured"
    assert metrics.webhook == {"sent": 1}


def test_hostile_alert_text_stays_in_a_valid_signed_json_body_posted_to_the_configured_url_only(
    tmp_path: Path,
) -> None:
    values, files = _secret_files(tmp_path)
    with hook_server(200) as attacker, hook_server(200) as hook:
        text = _hostile(attacker.url.replace("/hooks/secret-token", "/steal"))
        hostile = _anomaly(run_id=text, message=text, detector=text[:64], episode=text[:64])
        settings = {"webhook_secret_file": str(files["secret"]), "webhook_token_file": str(files["token"])}
        metrics = _post(hook.url, "sent", hostile, **settings)
    assert metrics.webhook == {"sent": 1} and hook.count() == 1 and attacker.count() == 0
    assert hook.paths == ["/hooks/secret-token"], "the configured URL's path, nothing the alert said"
    headers = _headers(hook, 0)
    assert set(headers) == {
        *("host", "accept", "accept-encoding", "connection", "user-agent", "content-length", "content-type"),
        *("authorization", "webhook-id", "webhook-timestamp", "webhook-signature"),
    }, "no header the alert chose"
    assert headers["authorization"] == f"Bearer {values['token']}"
    posted = _strict_json(hook.bodies[0])
    assert (posted["run_id"], posted["message"], posted["detector"]) == (text, text, text[:64]), "carried intact"
    assert _readme_verify()(values["secret"], headers, hook.bodies[0])
    assert not _readme_verify()(values["secret"], headers, hook.bodies[0].replace(b"37", b"38")), "a changed body"


def test_server_errors_are_retried_with_backoff_each_signed_afresh_under_one_id(tmp_path: Path) -> None:
    values, files = _secret_files(tmp_path)
    with hook_server(503, 500, 200) as hook:
        metrics = _post(hook.url, "sent", retries=3, webhook_secret_file=str(files["secret"]))
    assert hook.count() == 3
    assert metrics.webhook == {"sent": 1, "retried": 2}
    assert len({_headers(hook, n)["webhook-id"] for n in range(3)}) == 1, "a receiver can drop repeats by id"
    assert all(_readme_verify()(values["secret"], _headers(hook, n), hook.bodies[n]) for n in range(3))


def test_a_client_error_is_not_retried_and_counts_as_failed() -> None:
    with hook_server(400) as hook:
        metrics = _post(hook.url, "failed", retries=3)
    assert hook.count() == 1
    assert metrics.webhook == {"failed": 1}


def test_a_redirect_is_not_followed_not_retried_and_counts_as_failed(tmp_path: Path) -> None:
    _, files = _secret_files(tmp_path)
    with hook_server(200) as elsewhere, hook_server(307) as hook:
        hook.location = elsewhere.url
        metrics = _post(hook.url, "failed", retries=3, webhook_token_file=str(files["token"]))
    assert (hook.count(), elsewhere.count()) == (1, 0), "the body and the token stay with the configured URL"
    assert metrics.webhook == {"failed": 1}


def test_a_hung_server_times_out_then_the_sink_retries_and_gives_up() -> None:
    with hook_server(HANG) as hook:
        metrics = _post(hook.url, "failed", timeout_s=0.3, retries=1)
        assert hook.count() == 2
    assert metrics.webhook == {"retried": 1, "failed": 1}


def test_a_refused_connection_is_retried_then_failed_and_no_secret_is_logged(tmp_path: Path) -> None:
    values, files = _secret_files(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    url = f"http://127.0.0.1:{port}/hooks/path-secret"
    with structlog.testing.capture_logs() as logs:
        settings = {"webhook_secret_file": str(files["secret"]), "webhook_token_file": str(files["token"])}
        metrics = _post(url, "failed", retries=2, **settings)
    assert metrics.webhook == {"retried": 2, "failed": 1}
    failed = [e for e in logs if e["event"] == "alert_webhook_failed"]
    assert len(failed) == 1 and failed[0]["attempts"] == 3 and "ConnectError" in failed[0]["error"]
    logged = json.dumps(logs, default=str)
    assert values["secret"] not in logged and values["token"] not in logged and "path-secret" not in logged


def test_offer_never_waits_and_a_full_queue_drops_its_oldest_update() -> None:
    sink, metrics = _sink("http://127.0.0.1:9/x", queue_size=2)  # no worker: nothing leaves the queue
    for i in range(5):
        sink.offer(_anomaly(episode=f"e{i}"))
    assert metrics.webhook == {"dropped": 3}
    assert [a.episode for a in sink.queued()] == ["e3", "e4"], "the newest updates are kept"


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

        async def post() -> int:
            async with webhook_client(5.0) as client:
                return await post_json(client, f"http://127.0.0.1:{port}/", b"{}", {}, 5.0)

        # A transport error, retried like a reset connection: the client either parses the junk
        # (RemoteProtocolError) or meets the closed connection first (ReadError), as timing has it.
        with pytest.raises(httpx.TransportError):
            anyio.run(post, backend="asyncio")
        thread.join(5)


def test_webhook_url_must_be_http_with_a_host_and_is_redacted_in_logs() -> None:
    for bad in ("hooks.slack.com/services/T/B/secret", "http://", "https://h:99999/x"):
        with pytest.raises(ValueError, match="http:// or https://") as caught:
            AlertsConfig(webhook_url=bad)
        assert "secret" not in str(caught.value), "a webhook URL may hold a secret: it is not repeated"
    with pytest.raises(ConfigError, match="webhook_url"):
        load(env={"VIGIL_ALERTS_WEBHOOK_URL": "ftp://example.com/x"})
    assert load(env={"VIGIL_ALERTS_WEBHOOK_URL": "https://h.example/x", "VIGIL_ALERTS_RETRIES": "5"}).alerts == (
        AlertsConfig(webhook_url="https://h.example/x", retries=5)
    )
    assert redact("https://hooks.slack.com/services/T0/B0/secret") == "https://hooks.slack.com/..."


@pytest.mark.parametrize(
    ("setting", "content", "problem"),
    [
        ("webhook_secret_file", None, "cannot be read"),
        ("webhook_secret_file", "whsec_not-base64!", "whsec_ and the base64"),
        ("webhook_secret_file", "whsec_" + base64.b64encode(b"short").decode(), "at least 24 random bytes"),
        ("webhook_token_file", "two words", "printable ASCII without spaces"),
        ("webhook_token_file", "", "printable ASCII without spaces"),
    ],
)
def test_a_bad_secret_file_is_refused_at_start_naming_the_setting_never_the_secret(
    tmp_path: Path, setting: str, content: str | None, problem: str
) -> None:
    path = tmp_path / "secret"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=problem) as caught:
        _sink("http://127.0.0.1:9/x", **{setting: str(path)})
    assert f"alerts.{setting}" in str(caught.value) and str(path) in str(caught.value)
    assert not content or content not in str(caught.value)


TRAIN = """
import sys, trainvigil
vigil = trainvigil.init(run_id=sys.argv[1], flush_interval=0.05)
for step in range(int(sys.argv[2])):
    vigil.log(step, loss=1.0)
if sys.argv[3]:
    raise RuntimeError(sys.argv[3])
sys.exit(0 if vigil.close(timeout=60) else 1)
"""
"""A steady training script that, given a message, dies of an exception saying it (run_failed pages)."""


def _train(nats_url: str, run_id: str, steps: int, error: str = "") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "VIGIL_NATS_URL": nats_url}
    command = [sys.executable, "-c", TRAIN, run_id, str(steps), error]
    return subprocess.run(command, env=env, capture_output=True, timeout=120)


def _http(daemon: Daemon, path: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{daemon.http_port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def _webhook_total(daemon: Daemon, token: str) -> dict[str, float]:
    status, text = _http(daemon, "/metrics", token)
    assert status == 200
    found = re.findall(r'^vigil_alert_webhook_total\{outcome="(\w+)"\} (\S+)$', text, re.M)
    return {outcome: float(n) for outcome, n in found}


def test_a_failing_webhook_gets_hostile_alerts_signed_while_ingest_goes_on_and_never_sees_a_secret_logged(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Real daemon, agent, nats-server and webhook: the webhook answers 500, then hangs until released,
    then 500: retried with backoff while another run is stored (exact rows), then given up and counted;
    each attempt carries the hostile text intact in signed JSON; no secret ever reaches the log."""
    values, files = _secret_files(tmp_path)
    steps, clean_steps = 21, 400
    with hook_server(200) as attacker, hook_server(500, HANG, 500) as hook:
        hostile = _hostile(attacker.url.replace("/hooks/secret-token", "/steal"))
        run_id = "inj" + hostile[:60]
        env = {
            "VIGIL_ALERTS_WEBHOOK_URL": hook.url,
            "VIGIL_ALERTS_WEBHOOK_SECRET_FILE": str(files["secret"]),
            "VIGIL_ALERTS_WEBHOOK_TOKEN_FILE": str(files["token"]),
            "VIGIL_ALERTS_TIMEOUT_S": "60",  # the hang lasts until the test releases it
            "VIGIL_ALERTS_RETRIES": "2",
            "VIGIL_ALERTS_BACKOFF_S": "0.2",
            "VIGIL_HTTP_TOKEN_FILE": str(files["http"]),
            "VIGIL_LOG_LEVEL": "debug",
        }
        daemon = Daemon(nats_server.url, tmp_path / "data", env=env)
        daemon.start()
        try:
            crashed = _train(nats_server.url, run_id, steps, hostile)
            assert crashed.returncode == 1, crashed.stderr.decode()[-2000:]
            wait_for(lambda: hook.count() == 2, 30, "the first attempt (500), then the second, which hangs")
            # While the webhook hangs, another run is stored in full, and so is the crash's alert.
            clean = _train(nats_server.url, "clean", clean_steps)
            assert clean.returncode == 0, clean.stderr.decode()[-2000:]
            stored = "select count(*) from steps where run_id = 'clean'"
            wait_for(lambda: daemon.scalar(stored) == clean_steps, 60, "the clean run stored")
            assert daemon.sql("select run_id, count(*) from steps group by run_id order by 1").rows == [
                ["clean", clean_steps],
                [run_id, steps],
            ]
            assert daemon.sql("select run_id, detector, severity from anomalies").rows == [
                [run_id, "run_failed", "page"]
            ]
            assert _webhook_total(daemon, values["http"]) == {"retried": 1}, "still trying, ingest meanwhile"
            hook.release.set()
            wait_for(lambda: _webhook_total(daemon, values["http"]).get("failed") == 1, 30, "given up")
            assert _webhook_total(daemon, values["http"]) == {"retried": 2, "failed": 1}
            assert hook.count() == 3 and attacker.count() == 0
            assert daemon.terminate() == 0
        finally:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.kill()

    verify = _readme_verify()
    for n in range(3):
        headers = _headers(hook, n)
        assert hook.paths[n] == "/hooks/secret-token" and "x-injected" not in headers and "location" not in headers
        assert headers["authorization"] == f"Bearer {values['token']}"
        assert verify(values["secret"], headers, hook.bodies[n])
        posted = _strict_json(hook.bodies[n])
        assert posted["run_id"] == run_id and hostile in posted["message"] and posted["detector"] == "run_failed"
    log = daemon.log.read_text()
    assert "alert_webhook_failed" in log and '"signed": true' in log
    for secret in (*values.values(), values["secret"].removeprefix("whsec_")):
        assert secret not in log
    assert "secret-token" not in log, "the webhook URL's path is not logged"
