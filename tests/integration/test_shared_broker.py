"""The integration tier's shared broker (``tests/_support/shared_broker.py``): the tests of a worker share one
nats-server, each in a namespace of its own, so two tests' daemons never see each other's records; after each
test its streams are gone, and what it left made or subscribed is named."""

from __future__ import annotations

import asyncio
import os
from functools import partial
from pathlib import Path

import nats
import pytest
import shared_broker
from inprocess import InProcessDaemon
from shared_broker import NamespacedServer, fresh_namespace
from support import NatsServer, expected_loss, wait_for

import trainvigil
from trainvigil.schemas import DEFAULT_SUBJECTS

STEPS = 50


async def _streams(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        return [info.config.name or "" for info in await nc.jetstream().streams_info()]
    finally:
        await nc.close()


def _stored(daemon: InProcessDaemon, run_id: str) -> bool:
    return bool(daemon.scalar(f"select count(*) from steps where run_id = '{run_id}'") == STEPS)


def test_two_tests_namespaces_on_the_workers_broker_never_see_each_others_records(
    shared_nats_server: NatsServer, tmp_path: Path
) -> None:
    """What two tests in a row get from the ``nats_server`` fixture: each one's daemon stores its own runs only,
    and the clean-up after each leaves the broker without a stream."""
    tests = [NamespacedServer(shared_nats_server, fresh_namespace(name)) for name in ("first", "second")]
    assert tests[0].subjects.namespace != tests[1].subjects.namespace
    daemons = [InProcessDaemon(t.url, tmp_path / t.subjects.namespace, overrides={"namespace": t.subjects.namespace})
               for t in tests]  # fmt: skip
    try:
        for d in daemons:
            d.start()
        for i, t in enumerate(tests):
            agent = trainvigil.init(run_id=f"run-{i}", nats_url=t.url, namespace=t.subjects.namespace)
            for step in range(STEPS):
                agent.log(step, loss=expected_loss(0, step))
            assert agent.close(timeout=30), agent.stats()
        for i, d in enumerate(daemons):
            wait_for(partial(_stored, d, f"run-{i}"), 30, f"run-{i}'s steps")
            assert d.sql("select run_id from runs").rows == [[f"run-{i}"]], "the other namespace's run stays out"
        assert sorted(asyncio.run(_streams(shared_nats_server.url))) == sorted(t.subjects.stream_name for t in tests)
    finally:
        for d in daemons:
            d.close()
    for t in tests:
        t.clean()
    assert asyncio.run(_streams(shared_nats_server.url)) == []


def test_each_test_runs_in_its_namespace_and_its_daemon_serves_it(
    daemon: InProcessDaemon, nats_server: NamespacedServer
) -> None:
    assert os.environ["VIGIL_NAMESPACE"] == nats_server.subjects.namespace != ""
    assert daemon.config is not None and daemon.config.namespace == nats_server.subjects.namespace
    assert asyncio.run(_streams(nats_server.url)) == [nats_server.subjects.stream_name]
    for what in (nats_server.stop, nats_server.start):
        with pytest.raises(AssertionError, match="private_nats_server"):
            what()


def test_a_default_namespace_stream_left_on_the_shared_broker_is_named_and_deleted(
    shared_nats_server: NatsServer,
) -> None:
    test = NamespacedServer(shared_nats_server, fresh_namespace("default-stream"))

    async def make() -> None:
        nc = await nats.connect(test.url)
        try:
            await nc.jetstream().add_stream(name="VIGIL", subjects=DEFAULT_SUBJECTS.stream_subjects)
        finally:
            await nc.close()

    asyncio.run(make())
    with pytest.raises(AssertionError, match=r"\['VIGIL'\] of the default namespace.*private_nats_server"):
        test.clean()
    assert asyncio.run(_streams(test.url)) == []


def test_a_subscription_left_after_a_test_is_named(
    shared_nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    test = NamespacedServer(shared_nats_server, fresh_namespace("left-subscribed"))
    monkeypatch.setattr(shared_broker, "LEFT_SUBSCRIBED_S", 0.5)
    subject = test.subjects.alerts

    async def main() -> None:
        nc = await nats.connect(test.url, name="left-behind")
        try:
            await nc.subscribe(subject)
            await nc.flush()
            with pytest.raises(AssertionError, match=rf"still subscribed.*left-behind.*{subject}"):
                await asyncio.to_thread(test.clean)
        finally:
            await nc.close()

    asyncio.run(main())
    test.clean()  # once it closed, nothing is left
