"""The integration tier's broker: one nats-server per worker (session scope is a worker's), each test in a
namespace of its own (``tests/_support/shared_broker.py``); ``private_nats_server`` is a test's own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from shared_broker import NamespacedServer, fresh_namespace
from support import NatsServer


@pytest.fixture(scope="session")
def shared_nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """The worker's broker, started when its first test asks for one."""
    server = NatsServer(tmp_path_factory.mktemp("shared-jetstream"), monitor=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def nats_server(
    shared_nats_server: NatsServer, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[NamespacedServer]:
    """The worker's broker in a namespace no other test had, set as ``VIGIL_NAMESPACE`` in the test's environment:
    the agents it creates, the processes it starts and its daemons all read it. After the test its streams are
    deleted and nothing of it may still be subscribed."""
    server = NamespacedServer(shared_nats_server, fresh_namespace(request.node.name))
    monkeypatch.setenv("VIGIL_NAMESPACE", server.subjects.namespace)
    yield server
    server.clean()
