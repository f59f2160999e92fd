"""Who may do what on the bus: ``vigil up --auth`` and the nats-server config it writes.

One real daemon with its bundled nats-server for the module. Every attack goes through that
server with a role's generated credentials (or none, or a wrong password), as an attacker on the
same host would; what it could have changed is then checked as the daemon sees it.
"""

from __future__ import annotations

import asyncio
import logging
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import api
from support import SecuredDaemon, expected_loss, finish, run_producer, turned_away, wait_for

import trainvigil
from trainvigil.daemon import config
from trainvigil.daemon.broker.bus import embedded_auth
from trainvigil.daemon.cli.sqlclient import QuerySource
from trainvigil.daemon.config import StreamConfig
from trainvigil.errors import ConfigError, QueryRefusedError
from trainvigil.schemas.credentials import BusAccess, Credentials, credentials_text

STREAM = StreamConfig()
REFUSED_WAIT_S = 0.5
"""A refused JetStream API call is never answered: this long proves it."""


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredDaemon]:
    daemon = SecuredDaemon(tmp_path_factory.mktemp("auth") / "data")
    daemon.start()
    yield daemon
    daemon.terminate()


class Client:
    """One connection as a role, keeping the errors the server sent it (nats-py hands them to a callback)."""

    def __init__(self, nc: NATS, errors: list[Exception]) -> None:
        self.nc = nc
        self.errors = errors
        self.js = nc.jetstream(timeout=REFUSED_WAIT_S)

    async def violations(self) -> list[str]:
        # Two round trips: nats-py sends a flush's PING ahead of what is still queued.
        await self.nc.flush()
        await self.nc.flush()
        return [str(e) for e in self.errors if "violation" in str(e).lower()]


async def _as(bus: SecuredDaemon, role: str | None, body: Callable[[Client], Awaitable[Any]]) -> Any:
    errors: list[Exception] = []

    async def keep(exc: Exception) -> None:
        errors.append(exc)

    access = BusAccess(creds=str(bus.creds(role))) if role else BusAccess()
    nc = NATS()
    try:
        await nc.connect(bus.nats_url, allow_reconnect=False, error_cb=keep, **access.connect_options())
        return await body(Client(nc, errors))
    finally:
        await nc.close()


def as_role(bus: SecuredDaemon, role: str | None, body: Callable[[Client], Awaitable[Any]]) -> Any:
    return asyncio.run(_as(bus, role, body))


async def _refused(call: Awaitable[Any]) -> bool:
    """Whether a JetStream API call got no answer (the server dropped the forbidden request)."""
    try:
        await call
    except (TimeoutError, nats.errors.TimeoutError):
        return True
    return False


def _stream(bus: SecuredDaemon) -> tuple[Any, int]:
    """The stream's creation time and the daemon's consumers, as the daemon sees them."""

    async def look(c: Client) -> tuple[Any, int]:
        info = await c.js.stream_info(STREAM.name)
        return info.created, info.state.consumer_count

    return as_role(bus, "daemon", look)


def _count(bus: SecuredDaemon, run_id: str) -> tuple[int, int]:
    return tuple(bus.sql(f"select count(*), count(distinct step) from steps where run_id = '{run_id}'").rows[0])


def test_first_start_writes_private_users_and_the_ready_line_names_the_agents_file(bus: SecuredDaemon) -> None:
    directory = bus.data_dir / "bus"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
    assert files == {name: 0o600 for name in ("agent.toml", "daemon.toml", "reader.toml", "nats-server.conf")}
    ready = [line for line in bus.log.read_text().splitlines() if line.startswith("vigil: daemon ready")]
    assert len(ready) == 1
    assert f"VIGIL_NATS_CREDS={bus.creds('agent').resolve()}" in ready[0]


def test_without_credentials_or_with_a_wrong_password_nobody_connects(bus: SecuredDaemon, tmp_path: Path) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        as_role(bus, None, lambda c: c.nc.flush())
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(credentials_text(Credentials(user="daemon", password="guess"), "daemon", "a guess"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainvigil.daemon.cli",
            "sql",
            "select 1",
            "--nats",
            bus.nats_url,
            "--creds",
            str(wrong),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Authorization Violation" in done.stderr and "guess" not in done.stderr


def test_an_agent_with_its_credentials_is_stored_end_to_end_exactly(bus: SecuredDaemon) -> None:
    finish(run_producer(bus.nats_url, "auth-e2e", 0, 400, env={"VIGIL_NATS_CREDS": str(bus.creds("agent"))}))
    wait_for(lambda: _count(bus, "auth-e2e") == (400, 400), 30, "the agent's 400 steps")
    rows = bus.sql("select step, loss from steps where run_id = 'auth-e2e' order by step").rows
    assert [tuple(r) for r in rows] == [(s, expected_loss(0, s)) for s in range(400)]


def test_an_agent_with_a_wrong_password_keeps_its_data_and_says_so_in_one_line(
    bus: SecuredDaemon, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = tmp_path / "agent.toml"
    wrong.write_text(credentials_text(Credentials(user="agent", password="stale"), "agent", "an old password"))
    caplog.set_level(logging.WARNING, logger="trainvigil.agent")
    said, kept = turned_away(caplog, "refused", 50, nats_url=bus.nats_url, nats_creds=str(wrong))
    assert "Authorization Violation" in said and str(wrong) in said and "stale" not in said
    # Kept, not lost: delivered later with the right file.
    push = [sys.executable, "-m", "trainvigil.daemon.cli", "push", str(kept), "--nats", bus.nats_url]
    subprocess.run([*push, "--creds", str(bus.creds("agent"))], check=True, capture_output=True, timeout=30)
    wait_for(lambda: _count(bus, "refused") == (50, 50), 30, "the kept steps, pushed")


def test_an_agent_given_a_readers_file_keeps_its_data_and_says_so_in_one_line(
    bus: SecuredDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainvigil.agent")
    said, _ = turned_away(caplog, "mixed-up", 30, nats_url=bus.nats_url, nats_creds=str(bus.creds("reader")))
    assert 'permissions violation for publish to "vigil.v1.mixed-up.' in said
    assert _count(bus, "mixed-up") == (0, 0)


def test_a_reader_cannot_publish_records_nor_purge_or_delete_the_stream(bus: SecuredDaemon) -> None:
    before = _stream(bus)

    async def attack(c: Client) -> tuple[list[bool], list[str]]:
        forged = c.js.publish("vigil.v1.forged.metrics", b"\x80", timeout=REFUSED_WAIT_S)
        refused = await asyncio.gather(
            _refused(forged),
            _refused(c.js.purge_stream(STREAM.name)),
            _refused(c.js.delete_stream(STREAM.name)),
            _refused(c.js.delete_consumer(STREAM.name, STREAM.consumer)),
            _refused(c.js.add_stream(api.StreamConfig(name="STEAL", subjects=["vigil.v1.*.ckpt"]))),
        )
        return list(refused), await c.violations()

    refused, violations = as_role(bus, "reader", attack)
    assert refused == [True] * 5
    assert len(violations) == 5 and all("permissions violation for publish" in v for v in violations)
    assert _stream(bus) == before, "the stream was recreated or its consumer lost"
    assert bus.sql("select count(*) from runs where run_id = 'forged'").rows[0][0] == 0


def test_an_agent_cannot_send_sql_forge_alerts_manage_the_stream_or_read_replies(bus: SecuredDaemon) -> None:
    with (
        QuerySource(
            nats_url=bus.nats_url, data_dir=bus.data_dir, timeout=5, access=BusAccess(str(bus.creds("agent")))
        ) as source,
        pytest.raises(QueryRefusedError, match=r'permissions violation for publish to "vigil\.v1\.ctl\.sql"'),
    ):
        source.ask("select count(*) from steps", 10)

    async def attack(c: Client) -> tuple[bool, list[str]]:
        await c.nc.publish("vigil.v1.alerts.victim", b"forged alert")
        await c.nc.publish("vigil.v1.ctl.run", b"into the stream through ctl")  # matches vigil.v1.*.run
        await c.nc.subscribe("vigil.v1.ctl.sql", queue="vigil-query")  # answer queries in the daemon's place
        await c.nc.subscribe("_INBOX.reader.>")  # read the readers' answers
        refused = await _refused(c.js.purge_stream(STREAM.name))
        return refused, await c.violations()

    refused, violations = as_role(bus, "agent", attack)
    assert refused
    assert len(violations) == 5, violations
    assert sum("for subscription" in v for v in violations) == 2


def test_the_daemon_recreates_its_consumer_and_stream_when_someone_deletes_or_purges_them(
    bus: SecuredDaemon,
) -> None:
    """Only the daemon's user may do this now (an operator's mistake, say); agents never could
    create the stream again, so the daemon must, and an agent that keeps training loses nothing."""
    agent = trainvigil.init(
        run_id="survivor", nats_url=bus.nats_url, nats_creds=str(bus.creds("agent")), flush_interval=0.05
    )
    try:
        attacks: list[Callable[[Client], Awaitable[Any]]] = [
            lambda c: c.js.delete_consumer(STREAM.name, STREAM.consumer),
            lambda c: c.js.purge_stream(STREAM.name),
            lambda c: c.js.delete_stream(STREAM.name),
        ]
        for phase, attack in enumerate([None, *attacks]):
            if attack is not None:
                as_role(bus, "daemon", attack)
            for step in range(phase * 100, (phase + 1) * 100):
                agent.log(step, loss=expected_loss(0, step))
            n = (phase + 1) * 100

            def counted(n: int = n) -> bool:
                return _count(bus, "survivor") == (n, n)

            wait_for(counted, 30, f"{n} steps after attack {phase}")
        assert agent.close(timeout=10)
    finally:
        agent.close(timeout=1)
    log = bus.log.read_text()
    assert '"event": "stream_missing"' in log and '"level": "error"' in log
    assert '"event": "consumer_rewound"' in log
    losses = bus.sql("select reason from data_loss").rows
    assert all(tuple(r) == ("stream_recreated",) for r in losses), losses


def test_a_credentials_file_that_cannot_be_read_stops_init_with_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="VIGIL_NATS_CREDS"):
        trainvigil.init(run_id="x", nats_creds=str(tmp_path / "missing.toml"))


@pytest.mark.parametrize(
    ("host", "setting", "on"),
    [
        ("127.0.0.1", "auto", False),
        ("::1", "auto", False),
        ("localhost", "auto", False),
        ("0.0.0.0", "auto", True),
        ("10.1.2.3", "auto", True),
        ("gpu-box-3", "auto", True),  # a name may resolve anywhere
        ("127.0.0.1", "on", True),
        ("0.0.0.0", "off", False),
    ],
)
def test_auth_is_on_by_default_unless_the_bundled_broker_listens_on_loopback_only(
    host: str, setting: str, on: bool
) -> None:
    assert embedded_auth(config.load(overrides={"embedded_host": host, "embedded_auth": setting}, env={})) is on
