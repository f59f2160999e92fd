from __future__ import annotations

import compileall
import gc
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

# One compute thread in every test process and every process a test starts (daemons, training scripts, canary
# jobs), set before anything here loads torch or numpy: the runner gives each core one or two xdist workers, and
# on top of them OpenMP's default of a thread per core spins on locks; a torch test then burnt 3.5 times the
# CPU (28 s against 8 s for the same 200 optimizer steps) and took 4 times as long.
for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

from inprocess import InProcessDaemon  # noqa: E402
from support import Daemon, NatsServer  # noqa: E402


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the package once, for the hundreds of daemons, CLIs and training scripts the tests start.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (this project's VMs and CI set it), no process writes the
    ``__pycache__`` it compiled, so every one of them compiled all of trainvigil that it imported again: a
    daemon's start took ~1.5 s more (2.3 s to import the daemon against 0.8 s with the cache). ``compileall``
    writes the cache whatever that variable says; it is what Python writes without it, and git ignores it."""
    root = Path(__file__).resolve().parent.parent
    with open(root / "pyproject.toml", "rb") as file:
        folders = set(tomllib.load(file)["tool"]["setuptools"]["package-dir"].values())  # the source roots
    for folder in sorted(folders):
        compileall.compile_dir(root / folder, quiet=2)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The objects collection made (test modules and what they import at module level) are frozen once here, so no
    later garbage collection walks them and a test's guard against blocking never times one: when collection still
    imported torch, JAX, Ray and transformers (~700 000 objects, ~0.4 s a full collection), a loaded machine
    failed ``test_ten_thousand_log_calls_never_block_without_a_broker`` on a 416 ms ``log()`` so."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _own_spill_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Undelivered agent data goes to the test's own directory, never the user's cache."""
    monkeypatch.setenv("VIGIL_SPILL_DIR", str(tmp_path / "spill"))


@pytest.fixture
def private_nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of the test's own, its store in ``tmp_path``: for a test that stops, starts or kills the
    broker, reads its process, or names the default namespace's subjects and stream."""
    server = NatsServer(tmp_path / "jetstream")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def nats_server(private_nats_server: NatsServer) -> NatsServer:
    """The test's broker: its own here; the integration tier's ``conftest.py`` shares one per worker instead."""
    return private_nats_server


def _broker(request: pytest.FixtureRequest) -> NatsServer:
    """The broker of the test's daemon: ``private_nats_server`` when the test takes it, else ``nats_server``."""
    private = "private_nats_server" in request.fixturenames
    server: NatsServer = request.getfixturevalue("private_nats_server" if private else "nats_server")
    return server


@pytest.fixture
def daemon(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[InProcessDaemon]:
    """The daemon in this process (``inprocess.py``: what it shares with the test, and so who needs a process),
    in the namespace of the test's environment."""
    d = InProcessDaemon(_broker(request).url, tmp_path / "data")
    d.start()
    yield d
    d.close()


@pytest.fixture
def process_daemon(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemon]:
    """``vigil up`` as a process: for a test that kills or signals it, reads its log or memory, or times it."""
    d = Daemon(_broker(request).url, tmp_path / "data")
    d.start()
    yield d
    if d.process is not None and d.process.poll() is None:
        d.kill()


_SHARED_SCOPES = ("module", "class", "package")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (tests/run.py) the tests that share a module-scoped fixture (a daemon, a cluster,
    a batch of CLIs) go to one worker, which builds it once; every other test is dealt out on its own. A test that
    names its group (``@pytest.mark.xdist_group``: phases of one module that may run side by side) keeps it."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        if any(chain and chain[-1].scope in _SHARED_SCOPES for chain in defs.values()):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
