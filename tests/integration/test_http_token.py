"""The bearer token of the HTTP endpoint: everything but ``/healthz`` needs it.

On the bare server (a real listener on 127.0.0.1, in process) and on a real ``vigil up``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from support import Daemon, NatsServer

from trainvigil.daemon.broker.embedded import free_port
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.daemon.web.auth import carries_token
from trainvigil.daemon.web.http import serve_http
from trainvigil.daemon.web.routes import health


def _token_file(tmp_path: Path) -> tuple[str, Path]:
    token = secrets.token_urlsafe(32)
    path = tmp_path / "http.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token, path


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ([(b"host", b"x"), (b"authorization", b"Bearer s3cret")], True),
        ([(b"authorization", b"bearer   s3cret  ")], True),
        ([(b"host", b"x")], False),
        ([(b"authorization", b"Bearer s3cre")], False),
        ([(b"authorization", b"Bearer s3cret2")], False),
        ([(b"authorization", b"Basic s3cret")], False),
        ([(b"x-authorization", b"Bearer s3cret")], False),
    ],
)
def test_only_the_exact_bearer_token_in_an_authorization_header_counts(
    headers: list[tuple[bytes, bytes]], ok: bool
) -> None:
    assert carries_token(headers, b"s3cret") is ok
    assert carries_token(headers, b"") is True, "no token configured: every request is let in"


def test_the_endpoint_binds_loopback_by_default_and_takes_no_token_unless_given_one() -> None:
    assert (DaemonConfig().http_host, DaemonConfig().http_token_file) == ("127.0.0.1", "")


def test_the_bare_server_asks_for_the_token_everywhere_but_healthz(tmp_path: Path) -> None:
    token, path = _token_file(tmp_path)
    metrics = DaemonMetrics()
    metrics.broker_connected = True
    answers: dict[str, httpx.Response] = {}

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            port = await tg.start(serve_http, "127.0.0.1", free_port(), metrics, str(path))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
                answers["healthz"] = await client.get("/healthz")
                answers["none"] = await client.get("/metrics")
                answers["wrong"] = await client.get("/metrics", headers=_bearer(token[:-1] + "x"))
                answers["basic"] = await client.get("/metrics", headers={"Authorization": f"Basic {token}"})
                answers["head"] = await client.head("/metrics")
                answers["elsewhere"] = await client.get("/nothing")
                answers["right"] = await client.get("/metrics", headers=_bearer(token))
                answers["right elsewhere"] = await client.get("/nothing", headers=_bearer(token))
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")
    for refused in ("none", "wrong", "basic", "head", "elsewhere"):
        assert answers[refused].status_code == 401, refused
        assert answers[refused].headers["WWW-Authenticate"].startswith("Bearer"), refused
        assert "vigil_" not in answers[refused].text, refused
    assert answers["right"].status_code == 200 and answers["right"].text == metrics.render()
    assert answers["right elsewhere"].status_code == 404
    assert answers["healthz"].status_code == 200, "no token needed"
    assert answers["healthz"].content == json.dumps(health(metrics)[1]).encode(), "unchanged, no token"


def _get(port: int, path: str, token: str | None = None) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", headers=_bearer(token) if token else {}, trust_env=False)


def test_vigil_up_with_a_token_file_refuses_metrics_without_it_and_never_logs_it(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    token, path = _token_file(tmp_path)
    env = {"VIGIL_HTTP_TOKEN_FILE": str(path)}
    daemon = Daemon(nats_server.url, tmp_path / "data", "--http-host", "0.0.0.0", env=env)
    daemon.start()
    try:
        port = daemon.http_port
        assert _get(port, "/metrics").status_code == 401
        assert _get(port, "/metrics", "wrong-" + token).status_code == 401
        right = _get(port, "/metrics", token)
        assert right.status_code == 200 and "vigil_broker_connected 1" in right.text
        assert _get(port, "/healthz").status_code == 200, "orchestrators probe it without credentials"
        assert daemon.terminate() == 0
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.kill()
    log = daemon.log.read_text()
    assert token not in log
    assert "http_without_token" not in log, "on every interface with a token: nothing to warn about"


def test_vigil_up_with_an_unreadable_token_file_exits_2_naming_the_setting(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such.token"
    where = ["--nats", nats_server.url, "--data-dir", str(tmp_path / "data"), "--http-port", str(free_port())]
    up = subprocess.run(
        [sys.executable, "-m", "trainvigil.daemon.cli", "up", *where],
        env={**os.environ, "VIGIL_HTTP_TOKEN_FILE": str(missing)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert up.returncode == 2, up.stderr[-2000:]
    assert f"http_token_file (VIGIL_HTTP_TOKEN_FILE): {missing} cannot be read" in up.stderr.splitlines()[-1]
