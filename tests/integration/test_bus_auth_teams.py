"""Agents limited to their own runs: ``vigil auth DIR --team NAME=RUN,...`` and the nats-server config it writes.

One real nats-server running that config (with the mappings of one shard, so the partitioned subjects are
in play too) and one real daemon shard for the module. Every attempt goes through the server with a
team's generated credentials, as a training job of another team would make it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import stat
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from support import AuthBroker, ShardDaemon, finish, run_producer, secured_shard, turned_away, vigil, wait_for

from trainvigil.daemon.broker.auth import permissions
from trainvigil.schemas import DEFAULT_SUBJECTS
from trainvigil.schemas.credentials import BusAccess
from trainvigil.schemas.shards import partition_subjects

TEAMS = ("--team", "vision=vision-1,vision/2", "--team", "speech=speech-1")


@pytest.fixture(scope="module")
def teams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AuthBroker, ShardDaemon]]:
    with secured_shard(tmp_path_factory.mktemp("teams"), *TEAMS) as both:
        yield both


async def _as(url: str, creds: Path, body: Callable[[NATS], Awaitable[Any]]) -> tuple[Any, list[str]]:
    """``body(nc)`` on a connection with ``creds``; its result and the permission violations the server sent."""
    errors: list[Exception] = []

    async def keep(exc: Exception) -> None:
        errors.append(exc)

    nc = NATS()
    await nc.connect(url, allow_reconnect=False, error_cb=keep, **BusAccess(creds=str(creds)).connect_options())
    try:
        result = await body(nc)
        await nc.flush()  # two round trips: nats-py sends a flush's PING ahead of what is still queued
        await nc.flush()
        return result, [str(e) for e in errors if "violation" in str(e).lower()]
    finally:
        await nc.close()


def _steps(daemon: ShardDaemon, run_id: str) -> int:
    return int(daemon.scalar(f"select count(*) from steps where run_id = '{run_id}'"))


def _all_stored(daemon: ShardDaemon, run_id: str, steps: int) -> bool:
    return _steps(daemon, run_id) == steps


def test_a_team_gets_a_private_credentials_file_and_the_help_says_what_team_does(
    teams: tuple[AuthBroker, ShardDaemon],
) -> None:
    broker, _ = teams
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in broker.auth_dir.iterdir()}
    assert files["agent-vision.toml"] == files["agent-speech.toml"] == 0o600
    assert 'user = "agent-vision"' in broker.creds("agent-vision").read_text()
    described = vigil("auth", "--help")
    assert "--team NAME=RUN" in described.stdout and "own runs" in described.stdout


def test_a_teams_agent_publishes_its_own_runs_and_they_are_stored(teams: tuple[AuthBroker, ShardDaemon]) -> None:
    broker, daemon = teams
    env = {"VIGIL_NATS_CREDS": str(broker.creds("agent-vision"))}
    for run_id in ("vision-1", "vision/2"):  # a run id is granted as its subject token (vision_2)
        finish(run_producer(broker.url, run_id, 0, 40, env=env))
        wait_for(functools.partial(_all_stored, daemon, run_id, 40), 30, f"{run_id}'s 40 steps")


def test_a_teams_agent_cannot_publish_another_teams_or_anyone_elses_run(
    teams: tuple[AuthBroker, ShardDaemon], caplog: pytest.LogCaptureFixture
) -> None:
    broker, daemon = teams

    async def attempt(nc: NATS) -> None:
        for subject in ("vigil.v1.speech-1.metrics", "vigil.v1.other.run", "vigil.v1.0.speech-1.metrics"):
            await nc.publish(subject, b"forged")

    _, violations = asyncio.run(_as(broker.url, broker.creds("agent-vision"), attempt))
    assert len(violations) == 3 and all("permissions violation for publish" in v for v in violations), violations
    caplog.set_level(logging.WARNING, logger="trainvigil.agent")
    said, _ = turned_away(caplog, "speech-1", 20, nats_url=broker.url, nats_creds=str(broker.creds("agent-vision")))
    # The server names the subject it checked after the shard mapping: vigil.v1.<partition>.<run>.<kind>.
    assert re.search(r'permissions violation for publish to "vigil\.v1\.0\.speech-1\.', said), said
    assert _steps(daemon, "speech-1") == 0


def test_a_teams_agent_reads_its_own_inbox_only(teams: tuple[AuthBroker, ShardDaemon]) -> None:
    broker, _ = teams

    async def attempt(nc: NATS) -> None:
        await nc.subscribe("_INBOX.agent.>")  # every agent of the shared role
        await nc.subscribe("_INBOX.agent-speech.>")  # the other team's acks
        await nc.subscribe(nc.new_inbox())  # its own: allowed

    _, violations = asyncio.run(_as(broker.url, broker.creds("agent-vision"), attempt))
    assert len(violations) == 2 and all("permissions violation for subscription" in v for v in violations)


def test_the_shared_agent_role_still_publishes_every_run(teams: tuple[AuthBroker, ShardDaemon]) -> None:
    broker, daemon = teams
    finish(run_producer(broker.url, "anyone-1", 0, 30, env={"VIGIL_NATS_CREDS": str(broker.creds("agent"))}))
    wait_for(lambda: _steps(daemon, "anyone-1") == 30, 30, "the shared agent's 30 steps")


def test_vigil_auth_again_without_team_keeps_the_teams_and_a_team_can_be_given_new_runs(tmp_path: Path) -> None:
    where = tmp_path / "bus"
    assert vigil("auth", str(where), "--team", "vision=vision-1").returncode == 0
    password = where.joinpath("agent-vision.toml").read_text()
    assert vigil("auth", str(where)).returncode == 0
    assert vigil("auth", str(where), "--team", "vision=vision-3").returncode == 0
    assert where.joinpath("agent-vision.toml").read_text() == password, "the team keeps its password"
    config = json.loads(where.joinpath("nats-server.conf").read_text().split("\n", 1)[1])
    users = {u["user"]: u for u in config["accounts"]["VIGIL"]["users"]}
    assert set(users) == {"agent", "daemon", "reader", "agent-vision"}
    allowed = users["agent-vision"]["permissions"]["publish"]["allow"]
    assert "vigil.v1.vision-3.metrics" in allowed and not any("vision-1" in s for s in allowed)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("vision", "NAME=RUN"),
        ("vision=", "NAME=RUN"),
        ("bad name=run", "team name"),
        ("vision=a,,b", "an empty run id"),
    ],
)
def test_a_malformed_team_is_refused_in_one_line(tmp_path: Path, value: str, says: str) -> None:
    done = vigil("auth", str(tmp_path / "bus"), "--team", value)
    assert done.returncode == 2
    assert says in done.stderr.splitlines()[-1], done.stderr
    assert not (tmp_path / "bus" / "nats-server.conf").exists()


def test_a_teams_permissions_name_its_runs_subjects_only_and_their_partitions_when_sharded() -> None:
    kinds = [s.rsplit(".", 1)[1] for s in DEFAULT_SUBJECTS.stream_subjects]
    plain = permissions("agent", "agent-vision", runs=("vision-1", "vision/2"))
    assert plain is not None
    assert plain["publish"]["allow"] == [f"vigil.v1.{t}.{k}" for t in ("vision-1", "vision_2") for k in kinds]
    assert plain["subscribe"] == {"allow": ["_INBOX.agent-vision.>"]}
    sharded = permissions("agent", "agent-vision", runs=("vision-1",), sharded=True)
    assert sharded is not None
    assert sharded["publish"]["allow"] == [
        *(f"vigil.v1.vision-1.{k}" for k in kinds),
        *(s.replace(".*.*.", ".*.vision-1.") for s in partition_subjects()),
    ]
    assert permissions("agent", "agent") == permissions("agent", "agent", runs=None), "the shared role is unchanged"
