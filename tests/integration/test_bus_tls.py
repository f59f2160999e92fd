"""TLS on the bus: the bundled nats-server with a certificate signed by a CA made here.

The agent, the daemon and ``vigil sql`` connect over TLS trusting that CA (``VIGIL_NATS_TLS_CA``);
a client that does not trust it, or that speaks plain text, gets nothing through.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from support import SecuredDaemon, expected_loss, finish, run_producer, turned_away, wait_for

from trainvigil.schemas.credentials import BusAccess


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_ca(where: Path, name: str) -> Path:
    """A self-signed CA (``<name>.pem``, key ``<name>.key``) in ``where``; returns the certificate."""
    where.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(where, "req", "-x509", *key, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    return where / f"{name}.pem"


def make_server_cert(ca: Path) -> tuple[Path, Path]:
    """A certificate for ``127.0.0.1`` and ``localhost`` signed by ``ca``; returns (certificate, key)."""
    where = ca.parent
    (where / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
    )
    _openssl(where, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")  # fmt: skip
    _openssl(where, "x509", "-req", "-in", "server.csr", "-CA", ca.name, "-CAkey", ca.with_suffix(".key").name,
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")  # fmt: skip
    return where / "server.pem", where / "server.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("pki")
    ca = make_ca(where, "ca")
    cert, key = make_server_cert(ca)
    return {"ca": ca, "cert": cert, "key": key, "rogue": make_ca(where / "rogue", "rogue")}


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]) -> Iterator[SecuredDaemon]:
    env = {
        "VIGIL_EMBEDDED_TLS_CERT": str(pki["cert"]),
        "VIGIL_EMBEDDED_TLS_KEY": str(pki["key"]),
        "VIGIL_NATS_TLS_CA": str(pki["ca"]),  # the daemon's own connection trusts it
    }
    daemon = SecuredDaemon(tmp_path_factory.mktemp("tls") / "data", env=env, tls_ca=pki["ca"])
    daemon.start()  # answers the reader over TLS
    yield daemon
    daemon.terminate()


def test_the_agent_and_the_daemon_talk_over_tls_trusting_the_ca(bus: SecuredDaemon, pki: dict[str, Path]) -> None:
    assert bus.nats_url.startswith("tls://")
    assert f"VIGIL_NATS_URL={bus.nats_url}" in bus.log.read_text()
    env = {"VIGIL_NATS_CREDS": str(bus.creds("agent")), "VIGIL_NATS_TLS_CA": str(pki["ca"])}
    finish(run_producer(bus.nats_url, "over-tls", 0, 300, env=env))
    query = "select count(*), count(distinct step), sum(loss) from steps where run_id = 'over-tls'"
    want = (300, 300, sum(expected_loss(0, s) for s in range(300)))
    wait_for(lambda: tuple(bus.sql(query).rows[0]) == pytest.approx(want), 30, "300 steps over TLS")


def _connect(bus: SecuredDaemon, ca: Path | None) -> None:
    async def main() -> None:
        nc = NATS()
        access = BusAccess(creds=str(bus.creds("agent")), tls_ca=str(ca or ""))
        try:
            await nc.connect(bus.nats_url, allow_reconnect=False, connect_timeout=2, **access.connect_options())
        finally:
            # Bounded: after a failed TLS handshake nats-py's close waits for ever.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(nc.close(), 1)

    asyncio.run(main())


def test_a_client_without_the_ca_or_in_plain_text_is_refused(bus: SecuredDaemon, pki: dict[str, Path]) -> None:
    _connect(bus, pki["ca"])  # the same client trusting the CA gets in
    with pytest.raises(ssl.SSLCertVerificationError):
        _connect(bus, None)  # the system's CAs
    with pytest.raises(ssl.SSLCertVerificationError):
        _connect(bus, pki["rogue"])
    # Plain text: the server asks for TLS in its greeting and answers a clear-text CONNECT with nothing.
    port = int(bus.nats_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        info = json.loads(conn.recv(4096).decode().removeprefix("INFO "))
        assert info["tls_required"] is True
        password = (bus.creds("agent").read_text().split('password = "')[1]).split('"')[0]
        conn.sendall(f'CONNECT {{"user":"agent","pass":"{password}"}}\r\nPING\r\n'.encode())
        try:
            answer = conn.recv(4096)
        except (ConnectionResetError, TimeoutError):
            answer = b""
        assert b"PONG" not in answer


def test_an_agent_without_the_ca_keeps_its_data_and_says_why_in_one_line(
    bus: SecuredDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainvigil.agent")
    said, _ = turned_away(caplog, "untrusted", 20, nats_url=bus.nats_url, nats_creds=str(bus.creds("agent")))
    assert "TLS certificate is not trusted" in said and "VIGIL_NATS_TLS_CA" in said


def test_vigil_sql_without_the_ca_says_so_in_one_line(bus: SecuredDaemon) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainvigil.daemon.cli", "sql", "select 1", "--nats", bus.nats_url,
         "--creds", str(bus.creds("reader"))],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "TLS certificate is not trusted" in done.stderr, done.stderr
