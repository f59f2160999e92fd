"""Runs without a broker keep their data: sealed spill files, delivered by the next agent or ``vigil push``."""

from __future__ import annotations

import asyncio
import fcntl
import importlib
import inspect
import itertools
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from inprocess import InProcessDaemon
from support import Daemon, NatsServer, finish, run_producer, wait_for

import trainvigil
from trainvigil.agents.options import AgentOptions, default_spill_dir
from trainvigil.agents.spill._orphans import adopt, adopt_orphans
from trainvigil.agents.spill.outbox import (
    Outbox,
    OutMsg,
    frame,
    mark_delivered,
    read_frame,
    read_sealed_header,
    sealed_header,
    write_sealed,
)
from trainvigil.agents.spill.push import broker_key, push, upload
from trainvigil.daemon.broker.embedded import free_port
from trainvigil.daemon.cli.main import EXIT_OK
from trainvigil.daemon.cli.main import main as vigil_main
from trainvigil.errors import ConfigError
from trainvigil.schemas import Envelope, RunEvent, Source, StepBatch, Subjects, decode, encode

N = 2000
WARNING = "no broker answers at"


@pytest.fixture
def spill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The spill directory every agent of the test (in-process or child) uses."""
    where = tmp_path / "spill"
    monkeypatch.setenv("VIGIL_SPILL_DIR", str(where))
    return where


def _steps_in(path: Path) -> list[int]:
    """The steps a sealed file holds, read with the agent's own frame reader."""
    steps: list[int] = []
    with open(path, "rb") as f:
        read_sealed_header(f)
        while (item := read_frame(f)) is not None:
            for record in decode(item[0].payload).records:
                if isinstance(record, StepBatch):
                    steps += np.frombuffer(record.step, "<i8").tolist()
    return steps


def _run_offline(run_id: str, spill: Path, url: str | None = None) -> Path:
    """A producer process that never reaches a broker: it exits at once, warns once, keeps all N steps."""
    proc = run_producer(url or f"nats://127.0.0.1:{free_port()}", run_id, 0, N)
    started = time.monotonic()
    _, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - started
    stderr = err.decode()
    assert proc.returncode == 1, stderr  # close() is False: nothing was delivered yet
    assert elapsed < 20, f"close(timeout=60) without a broker took {elapsed:.1f} s"
    assert stderr.count(WARNING) == 1, stderr
    assert f"vigil push {spill}" in stderr, stderr
    [kept] = spill.glob(f"{run_id}-r0-p*.spill")
    assert sorted(_steps_in(kept)) == list(range(N))
    return kept


def _push(spill: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainvigil.daemon.cli", "push", str(spill), "--nats", url],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _rows(daemon: InProcessDaemon, run_id: str) -> int:
    return int(daemon.scalar(f"select count(*) from steps where run_id = '{run_id}'"))


def test_offline_run_keeps_its_steps_and_vigil_push_delivers_them_exactly_once(
    daemon: InProcessDaemon, nats_server: NatsServer, spill: Path
) -> None:
    _run_offline("offline-push", spill)
    pushed = _push(spill, nats_server.url)
    assert pushed.returncode == 0, pushed.stderr
    assert "delivered" in pushed.stderr and "pushed 1 of 1 files" in pushed.stderr, pushed.stderr
    wait_for(lambda: _rows(daemon, "offline-push") >= N, 30, f"{N} rows")
    assert _rows(daemon, "offline-push") == N
    assert daemon.scalar("select count(distinct step) from steps where run_id = 'offline-push'") == N
    assert list(spill.iterdir()) == [], "a delivered file is removed"
    again = _push(spill, nats_server.url)
    assert again.returncode == 0, again.stderr
    assert "nothing to push" in again.stderr
    assert _rows(daemon, "offline-push") == N
    assert daemon.scalar("select count(*) from events where run_id = 'offline-push' and kind = 'run_end'") == 1


def test_an_agent_whose_broker_answers_writes_nothing_to_its_spill_directory(
    daemon: InProcessDaemon, nats_server: NatsServer, spill: Path
) -> None:
    """Only a broker found away sends messages to disk: a read-only home hears no warning from a healthy run."""
    agent = trainvigil.init(run_id="online-only", nats_url=nats_server.url, flush_interval=0.01)
    for step in range(100):
        agent.log(step, loss=1.0)
    assert agent.close(timeout=30)
    assert not spill.exists()
    wait_for(lambda: _rows(daemon, "online-only") >= 100, 30, "100 rows")


def test_vigil_push_exits_3_when_no_broker_answers_and_keeps_the_file(spill: Path) -> None:
    kept = _run_offline("offline-nobroker", spill)
    pushed = _push(spill, f"nats://127.0.0.1:{free_port()}")
    assert pushed.returncode == 3, pushed.stderr
    assert pushed.stderr.startswith("vigil: no NATS broker answered"), pushed.stderr
    assert kept.exists()


def test_next_agent_delivers_the_leftover_and_killed_agents_files_meant_for_its_broker(
    tmp_path: Path, spill: Path
) -> None:
    server = NatsServer(tmp_path / "jetstream")  # its port stays closed until it starts
    daemon = InProcessDaemon(server.url, tmp_path / "data")
    kept = _run_offline("offline-left", spill, server.url)
    elsewhere = _run_offline("offline-elsewhere", spill)
    killed = _kill_after_spilling("offline-killed", server.url)
    server.start()
    try:
        daemon.start()
        finish(run_producer(server.url, "online-next", 0, N))
        # The next agent's close() lets the upload under way finish, so the file is gone when it exits.
        assert not kept.exists(), "the leftover file is removed once every message was acknowledged"
        assert elsewhere.exists(), "a file meant for another broker waits for vigil push"
        assert not killed.exists() and not killed.with_suffix(".spill").exists(), "a killed agent's file is sent too"
        for run_id in ("offline-left", "offline-killed", "online-next"):

            def arrived(run_id: str = run_id) -> bool:
                return _rows(daemon, run_id) >= N

            wait_for(arrived, 30, f"{N} rows of {run_id}")
            assert _rows(daemon, run_id) == N
        assert _rows(daemon, "offline-elsewhere") == 0
    finally:
        daemon.close()
        server.stop()


def test_a_script_that_exits_before_its_agent_connected_still_delivers_the_leftovers_without_an_error(
    daemon: InProcessDaemon, nats_server: NatsServer, spill: Path
) -> None:
    """The agent connects on its own thread; a script that ends at once has the interpreter shutting down
    by then, when asyncio's thread pool can no longer start: adopting killed agents' files there failed
    with "unexpected error ... can't register atexit after shutdown" and nothing left over was sent."""
    kept = spill / "left-r0-p1-n.spill"
    _event_file(kept, "left-before-quick", broker_key(nats_server.url), 50)
    quick = subprocess.run(
        [sys.executable, "-c", "import trainvigil; trainvigil.init(run_id='quick').log(0, loss=1.0)"],
        env={**os.environ, "VIGIL_NATS_URL": nats_server.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert quick.returncode == 0 and "unexpected error" not in quick.stderr, quick.stderr
    assert not kept.exists(), quick.stderr
    stored = "select count(*) from events where run_id = 'left-before-quick'"
    wait_for(lambda: daemon.scalar(stored) == 50, 30, "the leftover's 50 events")


# ---- the pieces, without a broker -------------------------------------------------------------


class _FakeJetStream:
    """Acknowledges the first ``budget`` messages it is given, then fails every one."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.ids: list[str] = []

    async def publish_async(self, subject: str, payload: bytes, headers: dict[str, str]) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.budget > 0:
            self.budget -= 1
            self.ids.append(headers["Nats-Msg-Id"])
            fut.set_result(None)
        else:
            fut.set_exception(TimeoutError("no ack"))
        return fut


def _sealed(path: Path, count: int) -> list[OutMsg]:
    msgs = [OutMsg("vigil.v1.r.metrics", f"r/0/h/1/nonce/{i}", bytes([i]) * 10, 1) for i in range(count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_sealed(path, "nats://127.0.0.1:4222", (frame(m) for m in msgs))
    return msgs


def test_partial_upload_keeps_only_the_unacknowledged_rest_then_removes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x-r0-p1-n.spill"
    msgs = _sealed(path, 10)
    first = _FakeJetStream(budget=4)
    result = asyncio.run(upload(first, path, max_inflight=3, ack_timeout=1))
    assert (result.messages, result.events) == (4, 4)
    assert result.error and path.exists()
    second = _FakeJetStream(budget=100)
    result = asyncio.run(upload(second, path, max_inflight=3, ack_timeout=1))
    assert result.done and result.messages == 6
    assert first.ids + second.ids == [m.msg_id for m in msgs], "each message once, in order, with its own id"
    assert not path.exists()


def test_an_upload_marks_its_progress_in_the_file_itself(tmp_path: Path) -> None:
    """A partial upload marks how far it got in the file's header, round by round: no copy of up to 2 GiB,
    and an uploader killed mid-file (vigil push, an agent delivering leftovers) does not resend it all."""
    path = tmp_path / "x-r0-p1-n.spill"
    msgs = _sealed(path, 10)
    inode = path.stat().st_ino
    result = asyncio.run(upload(_FakeJetStream(budget=4), path, max_inflight=3, ack_timeout=1))
    assert result.messages == 4 and path.stat().st_ino == inode
    assert [m.msg_id for m, _ in _frames(path)] == [m.msg_id for m in msgs[4:]]


def test_a_delivered_mark_outside_the_file_is_an_error_and_the_file_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "x-r0-p1-n.spill"
    _sealed(path, 3)
    mark_delivered(path, 10**6)
    before = path.read_bytes()
    js = _FakeJetStream(budget=100)
    result = asyncio.run(upload(js, path, max_inflight=8, ack_timeout=1))
    assert "delivered mark 1000000 is outside" in result.error and not js.ids
    assert path.read_bytes() == before


def test_a_sealed_file_of_the_first_format_is_still_delivered(tmp_path: Path) -> None:
    """Files kept by agents before the header had a delivered mark: read, and their rest rewritten."""
    path = tmp_path / "x-r0-p1-n.spill"
    msgs = [OutMsg("vigil.v1.r.metrics", f"r/0/h/1/nonce/{i}", bytes([i]) * 10, 1) for i in range(5)]
    path.write_bytes(b"trainvigil-spill/1\nnats://127.0.0.1:4222\n" + b"".join(frame(m) for m in msgs))
    first, second = _FakeJetStream(budget=2), _FakeJetStream(budget=100)
    assert asyncio.run(upload(first, path, max_inflight=3, ack_timeout=1)).messages == 2
    assert asyncio.run(upload(second, path, max_inflight=3, ack_timeout=1)).done
    assert first.ids + second.ids == [m.msg_id for m in msgs]
    assert not path.exists()


def test_a_file_another_process_holds_is_skipped_untouched(tmp_path: Path) -> None:
    path = tmp_path / "x-r0-p1-n.spill"
    _sealed(path, 3)
    before = path.read_bytes()
    with open(path, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        js = _FakeJetStream(budget=100)
        result = asyncio.run(upload(js, path, max_inflight=8, ack_timeout=1))
    assert result.skipped and not js.ids
    assert path.read_bytes() == before


def test_only_spill_files_whose_lock_is_free_are_adopted_and_their_leftovers_go_with_them(tmp_path: Path) -> None:
    """adopt_orphans on real files: a held lock (another open file, as another process's) or no lock file
    at all leaves a spill file alone; an empty one (killed before its first write) is removed with its lock,
    a half-made copy of Outbox.persist beside an adopted one too."""
    _sealed(tmp_path / "held-r0-p1-n.live", 3)
    _sealed(tmp_path / "nolock-r0-p1-n.live", 3)
    _sealed(tmp_path / "dead-r0-p1-n.live", 3)
    (tmp_path / "dead-r0-p1-n.live.tmp").write_bytes(b"half")
    (tmp_path / "empty-r0-p1-n.live").write_bytes(b"")
    for name in ("held", "dead", "empty"):
        (tmp_path / f"{name}-r0-p1-n.lock").touch()
    with open(tmp_path / "held-r0-p1-n.lock", "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert adopt_orphans(tmp_path) == [tmp_path / "dead-r0-p1-n.spill"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dead-r0-p1-n.spill",
        "held-r0-p1-n.live",
        "held-r0-p1-n.lock",
        "nolock-r0-p1-n.live",
    ]
    assert [m.msg_id for m, _ in _frames(tmp_path / "dead-r0-p1-n.spill")] == [f"r/0/h/1/nonce/{i}" for i in range(3)]
    assert adopt_orphans(tmp_path) == [tmp_path / "held-r0-p1-n.spill"], "its lock is free now"


def test_the_adopter_that_comes_second_leaves_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Eight ranks on a node adopt at once: one that listed the spill file, then took the lock after the
    first adopter had it, finds the file gone, and says nothing."""
    live = tmp_path / "dead-r0-p1-n.live"
    _sealed(live, 3)
    live.with_suffix(".lock").touch()
    with open(live.with_suffix(".lock"), "rb"):  # the second adopter opened the lock before the first ...
        assert adopt_orphans(tmp_path) == [live.with_suffix(".spill")]  # ... took the file and removed the lock
        live.with_suffix(".lock").touch()  # the lock as the second sees it, through the file it opened
        caplog.set_level(logging.INFO, "trainvigil.agent")
        assert adopt(live) is None  # with the spill file it listed before
    assert not caplog.records, caplog.text
    assert [m.msg_id for m, _ in _frames(live.with_suffix(".spill"))] == [f"r/0/h/1/nonce/{i}" for i in range(3)]


def test_an_agents_spill_file_and_its_lock_are_gone_once_it_was_read_back_and_acknowledged(tmp_path: Path) -> None:
    box = Outbox(max_memory_bytes=0, spill_path=tmp_path / "a.live", max_spill_bytes=10_000, broker="nats://b:1")
    box.push(OutMsg("s", "id", b"x", 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.live", "a.lock"]
    with open(tmp_path / "a.live", "rb") as f:
        assert read_sealed_header(f).broker == "nats://b:1", "a spill file is a sealed file for its broker"
    assert adopt_orphans(tmp_path) == [], "its owner holds the lock"
    assert box.peek(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.live", "a.lock"], "read back, not yet acknowledged"
    box.pop(1)
    assert not list(tmp_path.iterdir())


def _killed(box: Outbox, live: Path) -> list[str]:
    """The ids a killed ``box``'s spill file holds once adopted: what the next agent or vigil push sends."""
    box.forget_lock()  # as the kernel does when the process dies
    sealed = adopt(live)
    assert sealed is not None
    return [m.msg_id for m, _ in _frames(sealed)]


def test_messages_read_back_for_sending_stay_on_disk_until_acknowledged(tmp_path: Path) -> None:
    """A kill while the last messages of a spill file wait for their acks loses nothing: the file was
    removed as soon as they were read back, so they were in memory alone (up to max_inflight messages)."""
    live = tmp_path / "a.live"
    box = Outbox(max_memory_bytes=10_000, spill_path=live, max_spill_bytes=10_000, broker="b")
    for i in range(3):
        box.push(OutMsg("s", f"id{i}", b"x" * 10, 1), to_disk=True)
    assert [m.msg_id for m in box.peek(3)] == ["id0", "id1", "id2"]  # in flight: the whole file read back
    assert _killed(box, live) == ["id0", "id1", "id2"]


def test_a_killed_agents_spill_file_resends_only_what_was_not_acknowledged(tmp_path: Path) -> None:
    """Draining a spill file records how far JetStream acknowledged it, in the file's header: a kill
    mid-drain resends the rest, not the whole file (duplicates past JetStream's 2-minute window would be
    stored twice: events, checkpoints, GIL samples)."""
    live = tmp_path / "a.live"
    box = Outbox(max_memory_bytes=10_000, spill_path=live, max_spill_bytes=10_000, broker="b")
    for i in range(6):
        box.push(OutMsg("s", f"id{i}", b"x" * 10, 1), to_disk=True)
    box.pop(len(box.peek(2)))
    box.push(OutMsg("s", "id6", b"x" * 10, 1))  # behind the spilled ones: on disk too
    assert [m.msg_id for m in box.peek(2)] == ["id2", "id3"]  # in flight when the kill comes
    assert _killed(box, live) == ["id2", "id3", "id4", "id5", "id6"]


def test_persist_during_a_round_keeps_the_messages_in_flight_for_their_acks(tmp_path: Path) -> None:
    """flush() while the broker is away moves memory to disk; a round in flight then gets its acks:
    the messages it pops must be the ones it sent (persist emptied memory: the pop raised IndexError)."""
    live = tmp_path / "a.live"
    box = Outbox(max_memory_bytes=10_000, spill_path=live, max_spill_bytes=10_000, broker="b")
    for i in range(3):
        box.push(OutMsg("s", f"id{i}", b"x" * 10, 1))
    assert [m.msg_id for m in box.peek(2)] == ["id0", "id1"]
    assert box.persist()
    box.pop(2)  # the round's two acks
    assert [m.msg_id for m in box.peek(5)] == ["id2"]
    assert box.pending_events == 1
    assert _killed(box, live) == ["id2"], "persisted: on disk"


@pytest.mark.parametrize(("read_back", "in_memory"), [(0, False), (1, False), (2, False), (0, True)])
def test_sealing_renames_a_spill_file_that_holds_everything_else_copies(
    tmp_path: Path, read_back: int, in_memory: bool
) -> None:
    """Offline, every message is on disk: keeping them at exit is a rename, not a copy of up to 2 GiB,
    also after some were read back (acknowledged, or in flight). Only a message held in memory alone
    (sent before the broker went away) makes it a copy."""
    box = Outbox(max_memory_bytes=10_000, spill_path=tmp_path / "a.live", max_spill_bytes=10_000, broker="b")
    if in_memory:
        box.push(OutMsg("s", "mem", b"x" * 10, 1))
    for i in range(4):
        box.push(OutMsg("s", f"id{i}", b"x" * 10, 1), to_disk=True)
    inode = (tmp_path / "a.live").stat().st_ino
    box.pop(min(len(box.peek(read_back)), 1))  # acknowledged; a second one read back is in flight: still held
    held = (["mem"] if in_memory else []) + [f"id{i}" for i in range(4)]
    held = held[min(read_back, 1) :]
    assert box.seal(tmp_path / "a.spill") == len(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.spill"]
    assert ((tmp_path / "a.spill").stat().st_ino == inode) is (not in_memory)
    assert [m.msg_id for m, _ in _frames(tmp_path / "a.spill")] == held


def _frames(path: Path) -> list[tuple[OutMsg, int]]:
    with open(path, "rb") as f:
        read_sealed_header(f)
        return list(iter(lambda: read_frame(f), None))


def test_default_spill_dir_is_under_the_user_cache_dir() -> None:
    assert default_spill_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/trainvigil/spill")
    assert default_spill_dir({"XDG_CACHE_HOME": "relative"}) == Path.home() / ".cache/trainvigil/spill"
    assert default_spill_dir({}) == Path.home() / ".cache/trainvigil/spill"


# ---- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["garbage", "http://x", "nats://host:notaport", "nats://a:1,", "nats://a:1,ws://b:2"])
def test_malformed_nats_url_is_a_config_error_at_init(url: str, spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_NATS_URL", url)
    with pytest.raises(ConfigError, match="VIGIL_NATS_URL"):
        trainvigil.init(run_id="bad-url")


@pytest.mark.parametrize(
    "url", ["nats://h:4222", "tls://h", "ws://h:8080", "wss://h", "h:4222", "nats://a:1, nats://b:2", "[::1]:4222"]
)
def test_nats_url_accepts_nats_tls_ws_wss_host_port_and_lists(url: str, tmp_path: Path) -> None:
    assert AgentOptions(run_id="r", nats_url=url, spill_dir=tmp_path).nats_url == url


_SLOW_DISK = """
import os, sys, time
import trainvigil

fsync = os.fsync

def slow_fsync(fd):
    time.sleep(float(sys.argv[2]))  # a slow disk: what is kept takes this long to reach it
    fsync(fd)

os.fsync = slow_fsync
agent = trainvigil.init(run_id=sys.argv[1])
for step in range(2000):
    agent.log(step, loss=1.0)
print(agent.close(timeout=0.1), agent.stats()["kept_file"], flush=True)
"""


def test_close_returns_only_once_the_kept_file_is_written_even_when_the_disk_is_slow(
    spill: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() waits for the broker at most its timeout, but keeping what is undelivered is local work it
    finishes: a script that exits right after close() keeps every step even when writing takes seconds."""
    monkeypatch.setenv("VIGIL_NATS_URL", f"nats://127.0.0.1:{free_port()}")
    done = subprocess.run(
        [sys.executable, "-c", _SLOW_DISK, "slow-disk", "3.0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    returned, kept = done.stdout.split()
    assert returned == "False"  # nothing was delivered
    said = re.search(r"still keeping what was not delivered \((\d+) events packed so far\)", done.stderr)
    assert said and int(said[1]) >= 2002, done.stderr  # the 2000 steps, run_start, run_end (and heartbeats)
    [found] = spill.glob("slow-disk-r0-p*.spill")
    assert str(found) == kept
    assert sorted(_steps_in(found)) == list(range(2000))
    assert not list(spill.glob("*.live")) and not list(spill.glob("*.tmp")), list(spill.iterdir())


_KILLED = """
import sys, time
import trainvigil

agent = trainvigil.init(run_id=sys.argv[1], flush_interval=0.05)
steps = int(sys.argv[2])
for step in range(steps):
    agent.log(step, loss=1.0)
deadline = time.monotonic() + 60
while agent.stats()["pending_events"] < steps and time.monotonic() < deadline:  # sealed into messages
    time.sleep(0.01)
print("spilled", flush=True)
sys.stdin.read()  # until killed
"""


def _kill_after_spilling(run_id: str, url: str, check: Callable[[Path], None] = lambda live: None) -> Path:
    """An agent process for the broker at ``url`` (not up) that logs N steps and waits until they are
    sealed into messages (no flush(), no exit: while the broker is away those go to the spill file), runs
    ``check`` on that file while it lives, then is killed: the spill file it leaves."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED, run_id, str(N)],
        env={**os.environ, "VIGIL_NATS_URL": url},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"spilled\n", proc.stderr.read() if proc.stderr else ""
        [live] = Path(os.environ["VIGIL_SPILL_DIR"]).glob(f"{run_id}-r0-p{proc.pid}-*.live")
        assert live.with_suffix(".lock").exists()
        check(live)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    return live


def test_a_killed_agents_spill_file_is_adopted_and_pushed_exactly_once_but_never_while_it_lives(
    daemon: InProcessDaemon, nats_server: NatsServer, spill: Path
) -> None:
    """SIGKILL (the OOM killer) runs no exit: the spill file stays as it was. The next agent or
    vigil push seals it once its process is gone, a frame cut short by the kill cut off."""

    def not_while_it_lives(live: Path) -> None:
        assert adopt_orphans(spill) == [] and live.exists(), "a living agent's spill file is its own"
        before = live.read_bytes()
        by_hand = _push(live, nats_server.url)
        assert by_hand.returncode == 2, by_hand.stderr
        assert "is the spill file of an agent that is still running" in by_hand.stderr, by_hand.stderr
        assert live.read_bytes() == before

    live = _kill_after_spilling("killed", f"nats://127.0.0.1:{free_port()}", not_while_it_lives)
    with open(live, "ab") as f:
        f.write(b"\x03\x00\x00\x00\x05")  # a frame the kill cut short
    pushed = _push(spill, nats_server.url)
    assert pushed.returncode == 0, pushed.stderr
    assert f"{live.with_suffix('.spill').name}: the spill file of a killed agent" in pushed.stderr, pushed.stderr
    assert "pushed 1 of 1 files" in pushed.stderr, pushed.stderr
    assert "ends in a frame cut short by the kill; 5 bytes dropped" in pushed.stderr, pushed.stderr
    wait_for(lambda: _rows(daemon, "killed") >= N, 30, f"{N} rows")
    assert daemon.scalar("select count(distinct step) from steps where run_id = 'killed'") == N
    assert _rows(daemon, "killed") == N
    assert list(spill.iterdir()) == [], "no spill, lock or sealed file is left"


def _event_file(path: Path, run_id: str, broker: str, count: int) -> list[int]:
    """A sealed file of ``count`` messages of one event each (steps 0..count-1, made one a second until now),
    as an agent of the test's namespace keeps them; returns where each message's frame ends."""
    subjects = Subjects(os.environ.get("VIGIL_NAMESPACE", ""))
    source = Source(run_id=run_id, host="h", pid=1)
    then = time.time() - count
    frames = [
        frame(OutMsg(subjects.data(run_id, "run"), f"{run_id}/0/h/1/n/{i}", encode(envelope), 1))
        for i in range(count)
        for envelope in [Envelope(source=source, seq=i + 1, records=[RunEvent(time=then + i, kind="note", step=i)])]
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_sealed(path, broker, frames)
    return list(itertools.accumulate(map(len, frames), initial=len(sealed_header(broker))))[1:]


def _delivered_mark(path: Path) -> int:
    with open(path, "rb") as f:
        read_sealed_header(f)
        return f.tell()


def test_vigil_push_killed_mid_file_resends_only_the_round_in_flight(
    nats_server: NatsServer, spill: Path, tmp_path: Path
) -> None:
    """A push killed mid-file (SIGKILL: no clean-up runs) then run again past JetStream's duplicate window
    (1 s here, 120 s by default) sends again at most the round that was in flight (its acks may have come
    before the mark moved), and the daemon stores none of it twice. Before the delivered mark, it sent the
    whole file again, and every event the first push had delivered was stored twice; before the daemon looked
    up old records, the round in flight was."""
    daemon = Daemon(nats_server.url, tmp_path / "data", env={"VIGIL_STREAM_DUPLICATE_WINDOW_S": "1"})
    daemon.start()
    try:
        count, per_round = 5_000, inspect.signature(push).parameters["max_inflight"].default
        path = spill / "resumed-r0-p1-n.spill"
        ends = _event_file(path, "resumed", nats_server.url, count)
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainvigil.daemon.cli", "push", str(path), "--nats", nats_server.url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        two_rounds = ends[2 * per_round - 1]
        try:  # killed once two rounds are marked delivered: more than one round would be stored twice
            wait_for(lambda: proc.poll() is not None or _delivered_mark(path) >= two_rounds, 60, "two rounds", 0.005)
        finally:
            proc.kill()
            _, err = proc.communicate(timeout=30)
        assert path.exists(), f"the push ended before it could be killed: raise count ({err.decode()})"
        stored = "select count(*) from events where run_id = 'resumed'"
        wait_for(lambda: daemon.scalar(stored) >= 2 * per_round, 30, "the first push's events")
        time.sleep(1.5)  # past the 1 s duplicate window: JetStream no longer drops a resent message
        pushed = _push(path, nats_server.url)
        assert pushed.returncode == 0, pushed.stderr
        wait_for(
            lambda: daemon.scalar("select count(distinct step) from events where run_id = 'resumed'") == count,
            60,
            f"{count} events",
        )
        assert daemon.scalar(stored) == count, "a resend past the duplicate window is stored once"
        assert not path.exists()
    finally:
        daemon.kill()


_NO_STREAM = """
import sys, time
import trainvigil

agent = trainvigil.init(run_id=sys.argv[1], flush_interval=0.05)
deadline = time.monotonic() + 30
while not agent.stats()["connected"] and time.monotonic() < deadline:  # the broker answers; no stream yet
    time.sleep(0.01)
for step in range(int(sys.argv[2])):
    agent.log(step, loss=1.0)
print("safe" if agent.flush(10) else f"not safe: {agent.stats()}", flush=True)
sys.stdin.read()  # until killed
"""


def test_a_broker_that_stores_nothing_is_away_too_so_a_killed_agent_loses_nothing(
    nats_server: NatsServer, spill: Path, tmp_path: Path
) -> None:
    """Training started before the daemon: the broker answers, but no stream stores the messages yet (no
    acks). Those messages waited in memory (up to 64 MiB) and flush() could not make them safe, so a kill
    lost them all; the agent now treats unacknowledged rounds like a broker away: to the spill file."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _NO_STREAM, "no-stream", str(N)],
        env={**os.environ, "VIGIL_NATS_URL": nats_server.url},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        said = proc.stdout.readline()
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert said == b"safe\n", said + err[-2000:]  # and nothing before it: retries print nothing
    assert err.count(b"does not acknowledge what is published") == 1, err[-2000:]
    daemon = InProcessDaemon(nats_server.url, tmp_path / "data")
    daemon.start()  # the stream exists from now on
    try:
        pushed = _push(spill, nats_server.url)
        assert pushed.returncode == 0 and "the spill file of a killed agent" in pushed.stderr, pushed.stderr
        wait_for(lambda: _rows(daemon, "no-stream") >= N, 30, f"{N} rows")
        assert _rows(daemon, "no-stream") == N
    finally:
        daemon.close()


def test_vigil_push_says_how_far_a_big_file_got_while_it_goes(
    daemon: InProcessDaemon,
    nats_server: NatsServer,
    spill: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cli = importlib.import_module("trainvigil.daemon.cli.cmd_push")
    monkeypatch.setattr(cli, "PUSH_PROGRESS_S", 0.0)  # a line after every round, not every 5 s
    path = spill / "big-r0-p1-n.spill"
    _event_file(path, "big", broker_key(nats_server.url), 1_000)
    assert vigil_main(["push", str(path), "--nats", nats_server.url]) == EXIT_OK
    lines = [line for line in capsys.readouterr().err.splitlines() if "sent so far" in line]
    assert len(lines) >= 1_000 // 128, "one per round of 128 messages"
    assert re.fullmatch(r"vigil: big-r0-p1-n.spill: [0-9.]+ MiB of [0-9.]+ MiB sent so far, 128 messages", lines[0])


_KILLED_PARENT = """
import os, sys
import trainvigil

agent = trainvigil.init(run_id="parent", max_memory_bytes=1)
for step in range(100):
    agent.log(step, loss=1.0)
assert agent.flush(30)
if os.fork() == 0:  # a child (a DataLoader worker, say) that outlives its parent
    print("child", flush=True)  # its after-fork handlers ran
    sys.stdin.read()
    os._exit(0)
print("spilled", flush=True)
sys.stdin.read()
"""


def test_a_forked_child_that_outlives_its_killed_parent_does_not_hold_the_parents_spill_file(spill: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_PARENT],
        env={**os.environ, "VIGIL_NATS_URL": f"nats://127.0.0.1:{free_port()}"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert {proc.stdout.readline(), proc.stdout.readline()} == {b"spilled\n", b"child\n"}
        [live] = spill.glob(f"parent-r0-p{proc.pid}-*.live")  # the child has one of its own
        proc.kill()  # the parent only: the child keeps the same stdin open, and lives on
        proc.wait(30)
        assert adopt_orphans(spill) == [live.with_suffix(".spill")]
        assert sorted(_steps_in(live.with_suffix(".spill"))) == list(range(100))
    finally:
        proc.kill()
        proc.communicate(timeout=30)  # closes stdin: the child ends too
