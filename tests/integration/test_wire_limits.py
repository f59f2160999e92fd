"""The wire's limits held by the agent: what the daemon would refuse is refused at ``init()``, or dropped and
counted at ``log()``/``event()`` so that ``close()`` says so; settings with no sane upper end are refused."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from inprocess import InProcessDaemon
from support import NatsServer, expected_loss, free_port, vigil, wait_for

import trainvigil
from trainvigil.errors import ConfigError
from trainvigil.schemas.limits import INT32_MAX, MAX_FIELDS_DEPTH, MAX_NAME, fields_depth

STEPS = 500
LONG_RUN_ID = "lr=0.001," * 34  # 306 characters: a run named after its hyper-parameters


def _stored(daemon: InProcessDaemon, what: str) -> int:
    return int(daemon.scalar(f"select count(*) from {what}"))


@pytest.mark.parametrize(
    ("arguments", "env", "named"),
    [
        ({"run_id": LONG_RUN_ID}, {}, "run_id"),
        ({}, {"VIGIL_RUN_ID": LONG_RUN_ID}, "VIGIL_RUN_ID"),
        ({"run_id": "r", "host": "h" * (MAX_NAME + 1)}, {}, "host"),
        ({"run_id": "r"}, {"RANK": "3000000000", "WORLD_SIZE": "4000000000"}, "RANK"),
        ({"run_id": "r"}, {"WORLD_SIZE": "9999999999999"}, "WORLD_SIZE"),
        ({"run_id": "r"}, {"LOCAL_RANK": str(INT32_MAX + 1)}, "LOCAL_RANK"),
    ],
    ids=["run_id", "VIGIL_RUN_ID", "host", "RANK", "WORLD_SIZE", "LOCAL_RANK"],
)
def test_what_the_daemon_would_dead_letter_is_refused_at_init_not_lost_behind_a_true_close(
    daemon: InProcessDaemon,
    nats_server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    arguments: dict[str, Any],
    env: dict[str, str],
    named: str,
) -> None:
    """Before: ``init()`` took it, ``close()`` said True, and the daemon dead-lettered every message."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=named) as info:
        agent = trainvigil.init(nats_url=nats_server.url, flush_interval=0.05, **arguments)
        for step in range(STEPS):
            agent.log(step, loss=expected_loss(0, step))
        delivered = agent.close(timeout=30)
        wait_for(lambda: _stored(daemon, "steps") + _stored(daemon, "dead_letters") > 0, 30, "the daemon to ingest")
        stored = _stored(daemon, "steps")
        assert delivered is (stored == STEPS), f"close() said {delivered}; the daemon stored {stored} of {STEPS} steps"
    message = str(info.value)
    assert "\n" not in message and len(message) < 300, message
    assert info.value.key == named
    assert any(bound in message for bound in (str(MAX_NAME), str(INT32_MAX), "WORLD_SIZE")), message


def test_rank_outside_the_world_size_is_refused_at_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ConfigError, match=r"RANK=4.*WORLD_SIZE=4") as info:
        trainvigil.init(run_id="r", nats_url="nats://127.0.0.1:1").close(timeout=1)
    assert info.value.key == "RANK"


def test_an_explicit_world_size_takes_every_rank_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(INT32_MAX))
    monkeypatch.setenv("RANK", str(INT32_MAX - 1))
    agent = trainvigil.init(run_id="r", enabled=False)
    assert (agent.rank, agent.options.world_size) == (INT32_MAX - 1, INT32_MAX)
    agent.close()


def test_names_and_fields_past_the_limits_are_dropped_and_counted_the_rest_stored(
    daemon: InProcessDaemon, nats_server: NatsServer
) -> None:
    long_metric = "m" * (MAX_NAME + 1)
    deep: object = 1
    for _ in range(MAX_FIELDS_DEPTH + 2):
        deep = [deep]
    agent = trainvigil.init(run_id="limits", nats_url=nats_server.url, flush_interval=0.05)
    for step in range(STEPS):
        agent.log(step, **{"loss": expected_loss(0, step), long_metric: 1.0})
    agent.event("eval", step=1, deep=deep, score=0.5)
    agent.event("k" * (MAX_NAME + 1), step=2)
    assert agent.close(timeout=30) is False
    dropped = agent.stats()["dropped"]
    assert dropped == {"bad_value": STEPS, "bad_field": 2}, dropped
    wait_for(lambda: _stored(daemon, "steps where run_id = 'limits'") == STEPS, 30, f"{STEPS} steps")
    wait_for(lambda: _stored(daemon, "events where run_id = 'limits' and kind = 'run_end'") == 1, 30, "run_end")
    rows = daemon.sql("select step, loss, extra from steps where run_id = 'limits' order by step").rows
    assert [r[1] for r in rows] == [expected_loss(0, step) for step in range(STEPS)]
    assert not any(long_metric in str(r[2]) for r in rows)
    kinds = dict(daemon.sql("select kind, fields from events where run_id = 'limits' and step in (1, 2)").rows)
    assert set(kinds) == {"eval", "k" * MAX_NAME}, kinds
    fields = json.loads(kinds["eval"])
    assert fields["score"] == 0.5 and fields_depth(fields) <= MAX_FIELDS_DEPTH, kinds  # the deepest list cut off
    assert _stored(daemon, "dead_letters") == 0


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("VIGIL_FLUSH_INTERVAL", "1e300"),
        ("VIGIL_HEARTBEAT_INTERVAL", "inf"),
        ("VIGIL_ACK_TIMEOUT", "1e300"),
        ("VIGIL_CLOSE_TIMEOUT", "1e300"),
        ("VIGIL_RETRY_WAIT_MAX", "1e300"),
        ("VIGIL_BATCH_SIZE", str(10**12)),
        ("VIGIL_MAX_BUFFER", str(10**30)),
        ("VIGIL_MAX_SPILL_BYTES", str(10**30)),
        ("VIGIL_MAX_MEMORY_BYTES", str(2**63)),
        ("VIGIL_MAX_INFLIGHT", str(10**12)),
    ],
)
def test_agent_settings_past_their_upper_bound_are_refused_at_init(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable) as info:
        trainvigil.init(run_id="r", nats_url="nats://127.0.0.1:1").close(timeout=1)
    assert value in str(info.value) and "<=" in str(info.value), info.value


def _up(tmp_path: Path, nats_url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``vigil up`` as a real process; one that starts (takes the setting) is stopped after a while."""
    args = ("up", "--nats", nats_url, "--data-dir", str(tmp_path / "data"), "--http-port", str(free_port()))
    try:
        return vigil(*args, timeout=20, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        raise AssertionError(f"vigil up started with {env}") from None


@pytest.mark.parametrize(
    ("variable", "value", "key"),
    [
        ("VIGIL_STREAM_MAX_AGE_S", "1e300", "stream.max_age_s"),
        ("VIGIL_STREAM_DUPLICATE_WINDOW_S", "1e300", "stream.duplicate_window_s"),
        ("VIGIL_STREAM_ACK_WAIT_S", "1e300", "stream.ack_wait_s"),
        ("VIGIL_STREAM_MAX_BYTES", str(10**30), "stream.max_bytes"),
        ("VIGIL_QUERY_TIMEOUT_S", "1e300", "query_timeout_s"),
        ("VIGIL_FETCH_MAX_BYTES", str(10**30), "fetch_max_bytes"),
        ("VIGIL_ALERTS_DRAIN_S", "1e300", "alerts.drain_s"),
        ("VIGIL_CANARY_TIMEOUT_S", "1e300", "canary.timeout_s"),
    ],
)
def test_vigil_up_refuses_a_setting_past_its_upper_bound_naming_it(
    tmp_path: Path, nats_server: NatsServer, variable: str, value: str, key: str
) -> None:
    done = _up(tmp_path, nats_server.url, {variable: value})
    assert done.returncode != 0
    assert variable in done.stderr and key in done.stderr and "<=" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


def test_vigil_up_refuses_a_duplicate_window_longer_than_the_stream_keeps_messages(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    done = _up(tmp_path, nats_server.url, {"VIGIL_STREAM_MAX_AGE_S": "60", "VIGIL_STREAM_DUPLICATE_WINDOW_S": "120"})
    assert done.returncode != 0
    assert "VIGIL_STREAM_DUPLICATE_WINDOW_S" in done.stderr and "stream.max_age_s" in done.stderr, done.stderr[-2000:]
