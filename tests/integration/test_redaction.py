"""A password (or token) in a NATS URL never reaches a terminal or a log: ``redact_url`` and everything that prints one.

The end-to-end tests hand the secret to the real daemon, a real agent process, ``vigil sql`` and ``vigil push`` (by
flag and by ``VIGIL_NATS_URL``) and read back everything they wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import Daemon, NatsServer, finish, run_producer, vigil, wait_for

from trainvigil.daemon.broker.embedded import free_port
from trainvigil.schemas.redact import redact_url

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("nats://alice:s3cr3t@host:4222", "nats://alice:***@host:4222"),
        ("tls://alice:s3cr3t@host", "tls://alice:***@host"),
        ("nats://tok3n@host:4222", "nats://***@host:4222"),  # nats-py reads a lone user part as a token
        ("alice:s3cr3t@host:4222", "alice:***@host:4222"),  # HOST:PORT without a scheme
        ("nats://alice:p@ss@host:4222", "nats://alice:***@host:4222"),  # an unescaped '@' in the password
        ("nats://alice:@host", "nats://alice:***@host"),
        ("nats://alice:s3cr3t@", "nats://alice:***@"),  # malformed: still hidden
        ("wss://alice:s3cr3t@host/path@x", "wss://alice:***@host/path@x"),  # '@' after the host is not userinfo
        (
            "nats://a:one@h1:4222, nats://b:two@h2:4222,nats://h3:4222",
            "nats://a:***@h1:4222, nats://b:***@h2:4222,nats://h3:4222",
        ),
        ("--db=postgres://me:pw@db/x?a=b@c and nats://tok@h", "--db=postgres://me:***@db/x?a=b@c and nats://***@h"),
        ("", ""),
    ],
)
def test_redact_url_hides_the_password_or_token_of_every_url_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(shown) == shown, "redacting twice changes nothing"


def test_the_daemons_log_and_ready_line_never_show_the_password_of_its_nats_url(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A broker without users takes any credentials: the daemon connects, runs, and says where, redacted."""
    url = f"nats://alice:{SECRET}@127.0.0.1:{nats_server.port}"
    daemon = Daemon(url, tmp_path / "data", env={"VIGIL_LOG_LEVEL": "debug"})
    daemon.start()
    try:
        finish(run_producer(url, "redacted-run", 0, 50))
        wait_for(lambda: daemon.scalar("select count(*) from steps") == 50, 30, "the run's 50 steps")
    finally:
        daemon.terminate()
    log = daemon.log.read_text()
    assert "daemon ready" in log and f"nats://alice:***@127.0.0.1:{nats_server.port}" in log, log[-3000:]
    assert SECRET not in log, log[-3000:]


def test_an_agent_without_a_broker_never_prints_the_password_of_its_url(tmp_path: Path) -> None:
    url = f"nats://alice:{SECRET}@127.0.0.1:{free_port()}"
    proc = run_producer(url, "redacted-offline", 0, 20)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1  # nothing delivered: kept for vigil push
    said = out.decode() + err.decode()
    assert "no broker answers at nats://alice:***@" in said, said
    assert SECRET not in said, said


@pytest.mark.parametrize("by", ["flag", "env"])
def test_vigil_sql_errors_never_show_the_password_of_the_url(tmp_path: Path, by: str) -> None:
    url = f"nats://alice:{SECRET}@127.0.0.1:{free_port()}"
    args = ["sql", "select 1", "--data-dir", str(tmp_path / "none")]
    env = {k: v for k, v in os.environ.items() if k != "VIGIL_NATS_URL"}
    if by == "flag":
        args += ["--nats", url]
    else:
        env["VIGIL_NATS_URL"] = url
    done = vigil(*args, env=env)
    assert done.returncode == 3, done.stderr
    assert "nats://alice:***@127.0.0.1" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr


def test_a_malformed_url_is_refused_without_echoing_its_password(tmp_path: Path) -> None:
    done = vigil("sql", "select 1", "--data-dir", str(tmp_path), "--nats", f"nats://alice:{SECRET}@")
    assert done.returncode == 2, done.stderr
    assert "alice:***@" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize("by", ["flag", "env"])
def test_vigil_push_never_shows_the_password_of_the_url(tmp_path: Path, by: str) -> None:
    """The offline agent keeps its file for the broker it was given (the secret redacted in the file too); vigil
    push to a broker that is not up says so without the password."""
    spill = tmp_path / "spill"
    url = f"nats://alice:{SECRET}@127.0.0.1:{free_port()}"
    proc = run_producer(url, "redacted-push", 0, 20, env={"VIGIL_SPILL_DIR": str(spill)})
    proc.communicate(timeout=60)
    [kept] = spill.glob("*.spill")
    assert SECRET.encode() not in kept.read_bytes(), "a spill file names its broker without the password"
    env = {k: v for k, v in os.environ.items() if k != "VIGIL_NATS_URL"}
    args = ["push", str(spill)]
    if by == "flag":
        args += ["--nats", url]
    else:
        env["VIGIL_NATS_URL"] = url
    done = vigil(*args, env=env, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "nats://alice:***@127.0.0.1" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr


def test_vigil_push_to_a_broker_that_takes_it_never_shows_the_password(nats_server: NatsServer, tmp_path: Path) -> None:
    """The progress and summary lines name the broker: redacted. (The stream is missing: no daemon, so the files
    stay, which makes every line print.)"""
    spill = tmp_path / "spill"
    url = f"nats://alice:{SECRET}@127.0.0.1:{free_port()}"
    run_producer(url, "redacted-push2", 0, 20, env={"VIGIL_SPILL_DIR": str(spill)}).communicate(timeout=60)
    live = f"nats://alice:{SECRET}@127.0.0.1:{nats_server.port}"
    done = subprocess.run(
        [sys.executable, "-m", "trainvigil.daemon.cli", "push", str(spill), "--nats", live],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert "kept for nats://alice:***@127.0.0.1" in done.stderr, done.stderr
    assert f"to nats://alice:***@127.0.0.1:{nats_server.port}" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr
