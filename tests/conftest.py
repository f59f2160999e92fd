from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Daemon, NatsServer


def pytest_collection_finish(session: pytest.Session) -> None:
    """Collecting imports every test module, and with them torch, JAX, Ray and transformers: ~700 000 objects,
    whose full garbage collection takes ~0.4 s on this machine. Frozen once here, no later collection walks them,
    so a test's guard against blocking (``log()`` never waits on the network) never times one: a clean-clone CI
    run failed ``test_ten_thousand_log_calls_never_block_without_a_broker`` on a 416 ms ``log()`` so."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _own_spill_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Undelivered agent data goes to the test's own directory, never the user's cache."""
    monkeypatch.setenv("VIGIL_SPILL_DIR", str(tmp_path / "spill"))


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "jetstream")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def daemon(nats_server: NatsServer, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(nats_server.url, tmp_path / "data")
    d.start()
    yield d
    if d.process is not None and d.process.poll() is None:
        d.kill()
