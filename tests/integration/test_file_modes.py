"""What the daemon and the agent keep on disk is theirs alone: no group or other bits, whatever the umask.

The history (``run_start`` records the command line, secrets included), the JetStream store and the agent's spill
files are read by nobody but their owner. Checked under the usual umask (022) with a real ``vigil up --auth``, its
bundled nats-server and real agents, one of them spilling because its broker is down.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import SecuredDaemon, finish, run_producer, wait_for

from trainvigil.daemon.broker.embedded import free_port
from trainvigil.schemas.private import open_private, private_dir


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask for this test and every process it starts."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _open_to_others(root: Path) -> str:
    """``root`` and everything under it with a group or other permission bit, a ``path mode`` line each."""
    found = []
    for path in [root, *root.rglob("*")]:
        try:
            mode = stat.S_IMODE(path.lstat().st_mode)
        except FileNotFoundError:  # gone meanwhile (a WAL after a checkpoint)
            continue
        if mode & 0o077:
            found.append(f"{path.relative_to(root.parent)} {mode:o}")
    return "\n".join(found)


def test_the_history_the_jetstream_store_and_spill_files_are_private_under_umask_022(
    tmp_path: Path, umask_022: None
) -> None:
    daemon = SecuredDaemon(tmp_path / "data")
    daemon.start()
    try:
        agent = {"VIGIL_NATS_CREDS": str(daemon.creds("agent"))}
        finish(run_producer(daemon.nats_url, "private-run", 0, 200, "--pace", "0.001", env=agent))
        wait_for(lambda: daemon.scalar("select count(*) from steps") == 200, 30, "the 200 steps")
        store = daemon.data_dir / "jetstream"
        assert list(store.rglob("*.blk")), "JetStream wrote its message blocks"
        assert (daemon.data_dir / "vigil.duckdb.wal").exists(), "DuckDB holds a WAL while it runs"
        assert _open_to_others(daemon.data_dir) == ""
    finally:
        daemon.terminate()
    assert _open_to_others(daemon.data_dir) == "", "after the final checkpoint too"

    spill = Path(os.environ["VIGIL_SPILL_DIR"])  # the test's own (conftest)
    proc = run_producer(f"nats://127.0.0.1:{free_port()}", "spilled-run", 0, 500)  # no broker there
    proc.communicate(timeout=60)
    assert proc.returncode == 1  # kept, not delivered
    assert list(spill.glob("spilled-run-*.spill")), "the agent kept its steps in a sealed file"
    assert _open_to_others(spill) == ""


def test_existing_directories_and_files_with_wider_modes_are_tightened(tmp_path: Path, umask_022: None) -> None:
    """A data directory, store and spill directory an older version (or ``mkdir``) left open are the daemon's and
    the agent's own: they are made private when used."""
    data = tmp_path / "data"
    (data / "jetstream").mkdir(parents=True, mode=0o755)
    data.chmod(0o755)
    spill = Path(os.environ["VIGIL_SPILL_DIR"])
    spill.mkdir(mode=0o755)
    spill.chmod(0o755)
    daemon = SecuredDaemon(data)
    daemon.start()
    try:
        assert _open_to_others(data) == ""
    finally:
        daemon.terminate()
    old = data / "vigil.duckdb"
    old.chmod(0o644)
    daemon = SecuredDaemon(data)
    daemon.start()
    try:
        assert _open_to_others(data) == "", "a history file opened again is made private"
    finally:
        daemon.terminate()
    proc = run_producer(f"nats://127.0.0.1:{free_port()}", "spilled-again", 0, 50)
    proc.communicate(timeout=60)
    assert _open_to_others(spill) == ""


def test_private_dir_creates_0700_and_tightens_only_what_this_user_owns(tmp_path: Path, umask_022: None) -> None:
    fresh = tmp_path / "a" / "b"
    assert private_dir(fresh) == ""
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o775)
    assert private_dir(mine) == "" and stat.S_IMODE(mine.stat().st_mode) == 0o700
    if os.getuid() != 0:  # only root can hand a directory to someone else
        return
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 12345, -1)
    why = private_dir(theirs)
    assert str(theirs) in why and "uid 12345" in why and "\n" not in why
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o755, "someone else's directory is left as it is"


def test_open_private_creates_0600_and_tightens_an_existing_file(tmp_path: Path, umask_022: None) -> None:
    new, old = tmp_path / "new", tmp_path / "old"
    old.write_bytes(b"x")
    old.chmod(0o644)
    for path in (new, old):
        os.close(open_private(path, os.O_WRONLY | os.O_CREAT))
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
