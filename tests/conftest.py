from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Daemon, NatsServer


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
