"""One NATS URL parser for every client: the forms it takes, the ones it refuses, and the commands that use it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import nats
import pytest
from follower import Follower
from support import AuthBroker, Daemon, NatsServer, finish, run_producer, vigil, wait_for

from trainvigil.daemon.broker.embedded import free_port
from trainvigil.daemon.config import DaemonConfig
from trainvigil.errors import ConfigError
from trainvigil.schemas import DEFAULT_SUBJECTS, Anomaly, Envelope, Source, encode
from trainvigil.schemas.natsurl import parse_nats_url


@pytest.mark.parametrize(
    ("url", "servers"),
    [
        ("nats://h1:4222", ("nats://h1:4222",)),
        ("nats://h1", ("nats://h1",)),
        ("tls://h1:4443", ("tls://h1:4443",)),
        ("ws://h1:8080", ("ws://h1:8080",)),
        ("wss://h1", ("wss://h1",)),
        ("h1:4222", ("nats://h1:4222",)),
        ("127.0.0.1:4222", ("nats://127.0.0.1:4222",)),
        ("[::1]:4222", ("nats://[::1]:4222",)),
        ("nats://h1:1, h2:2 ,tls://h3:3", ("nats://h1:1", "nats://h2:2", "tls://h3:3")),
        ("ws://h1:1,wss://h2:2", ("ws://h1:1", "wss://h2:2")),
        ("nats://alice:s3cret@h1:4222", ("nats://alice:s3cret@h1:4222",)),
        ("tok@h1:4222", ("nats://tok@h1:4222",)),
    ],
)
def test_every_accepted_form_gives_the_servers_nats_py_connects_to(url: str, servers: tuple[str, ...]) -> None:
    parsed = parse_nats_url(url)
    assert parsed.servers == servers
    assert parsed.url == url


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("", "is ''"),
        ("localhost", "is 'localhost'"),
        ("http://h1:4222", "is 'http://h1:4222'"),
        ("nats://h1:0", "is 'nats://h1:0'"),
        ("nats://h1:port", "is 'nats://h1:port'"),
        ("nats://h1:70000", "is 'nats://h1:70000'"),
        ("nats://:4222", "is 'nats://:4222'"),
        ("h1:4222,", "holds ''"),
        ("nats://h1:1,oops", "holds 'oops'"),
    ],
)
def test_every_refused_form_says_what_a_nats_url_looks_like(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_nats_url(url)
    message = str(caught.value)
    assert said in message and "nats://HOST:PORT" in message and "several comma-separated" in message
    assert caught.value.key == "nats_url"


def test_websocket_and_plain_urls_in_one_list_are_refused() -> None:
    with pytest.raises(ConfigError, match="mixes websocket and plain NATS URLs; use one kind"):
        parse_nats_url("ws://h1:1,nats://h2:2")


def test_a_refusal_names_the_setting_it_came_from_and_never_the_password() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_nats_url("nats://alice:s3cret@h1:1,oops", key="--nats / VIGIL_NATS_URL")
    message = str(caught.value)
    assert message.startswith("--nats / VIGIL_NATS_URL ")
    assert "s3cret" not in message and "alice:***@h1" in message


def test_str_and_repr_hide_passwords_and_tokens() -> None:
    parsed = parse_nats_url("nats://alice:s3cret@h1:4222,tok3n@h2:1")
    for shown in (str(parsed), repr(parsed), f"{parsed}"):
        assert "s3cret" not in shown and "tok3n" not in shown
    assert str(parsed) == "nats://alice:***@h1:4222,nats://***@h2:1"
    assert "alice:***@h1:4222" in repr(parsed)
    assert parsed.servers[0] == "nats://alice:s3cret@h1:4222"  # connecting uses the secret


def test_two_spellings_of_one_list_are_equal() -> None:
    assert parse_nats_url("h1:1, nats://h2:2") == parse_nats_url("nats://h1:1,nats://h2:2")
    assert parse_nats_url("h1:1").websocket is False and parse_nats_url("wss://h1").websocket is True


def test_the_daemon_config_takes_a_url_without_a_scheme_and_refuses_as_the_agent_does() -> None:
    assert DaemonConfig(nats_url="127.0.0.1:4222").nats_url == "127.0.0.1:4222"
    with pytest.raises((ConfigError, ValueError), match="mixes websocket and plain"):
        DaemonConfig(nats_url="ws://h1:1,nats://h2:2")


class _EnvDaemon(Daemon):
    """``vigil up`` told its broker by ``VIGIL_NATS_URL`` alone."""

    def broker_args(self) -> list[str]:
        return []


def test_vigil_up_and_vigil_sql_take_host_port_without_a_scheme(nats_server: NatsServer, tmp_path: Path) -> None:
    bare = f"127.0.0.1:{nats_server.port}"
    daemon = _EnvDaemon(bare, tmp_path / "data", env={"VIGIL_NATS_URL": bare})
    daemon.start()
    try:
        finish(run_producer(bare, "bare", 0, 20))
        wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'bare'") == 20, 60, "20 steps")
        env = {**os.environ, "VIGIL_NATS_URL": bare}
        answered = vigil("sql", "select count(*) as n from steps where run_id = 'bare'", "--format", "csv", env=env)
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout.split() == ["n", "20"]
        assert "no daemon answered" not in answered.stderr  # the daemon answered, not the file
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.kill()


def test_vigil_alerts_follow_fails_over_along_a_comma_separated_list(private_nats_server: NatsServer) -> None:
    """The first server of the list is down: the follow reaches the second and prints what is published there."""
    url = f"nats://127.0.0.1:{free_port()},nats://127.0.0.1:{private_nats_server.port}"
    with Follower("--format", "json", "--nats", url) as follower:
        said = follower.following(timeout=30)
        assert "following vigil.v1.alerts.>" in said, said

        async def publish() -> None:
            nc = await nats.connect(private_nats_server.url)
            alert = Anomaly(time=1.0, run_id="far", rank=0, step=3, detector="nan", severity="page", state="open")
            await nc.publish(
                DEFAULT_SUBJECTS.alert("far"), encode(Envelope(source=Source(run_id="far"), records=[alert]))
            )
            await nc.flush()
            await nc.close()

        asyncio.run(publish())
        got = follower.next_alert(timeout=30)
        assert (got["run_id"], got["detector"], got["step"]) == ("far", "nan", 3)
        assert follower.stop() == 0


def test_vigil_alerts_follow_says_at_once_that_the_broker_refused_its_credentials(tmp_path: Path) -> None:
    """A wrong (here: missing) password is a refusal to fix, not "no broker": said as such, without retrying."""
    broker = AuthBroker(tmp_path)
    broker.start()
    try:
        followed = vigil("alerts", "--follow", "--nats", broker.url, timeout=60)
    finally:
        broker.stop()
    assert followed.returncode != 0
    assert "turned this client away" in followed.stderr and "VIGIL_NATS_CREDS" in followed.stderr, followed.stderr
    assert "no broker answered" not in followed.stderr
