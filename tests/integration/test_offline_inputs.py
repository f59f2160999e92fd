"""Crafted files given to the offline commands (``vigil push``, ``verify``, ``replay``) and planted beside a
checkpoint: refused by kind and by content with a line that says why, never a hang, a traceback, a raw escape
sequence on the terminal or a write through someone else's symbolic link.

Every command runs as a real process with a deadline (``support.vigil(..., timeout=...)``): a regression that
blocks on a FIFO fails the test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from inprocess import InProcessDaemon
from support import Daemon, NatsServer, vigil, wait_for

from trainvigil.agents.spill.outbox import OutMsg, frame, sealed_header, write_sealed
from trainvigil.agents.spill.push import broker_key
from trainvigil.daemon.broker.embedded import free_port
from trainvigil.schemas import DEFAULT_SUBJECTS, Envelope, RunEvent, Source, encode

DEADLINE_S = 120
"""Each command's deadline: generous on a loaded machine, and a hang fails instead of blocking the suite."""


def _event(run_id: str, i: int, subject: str | None = None) -> OutMsg:
    """One message of one event of ``run_id``, as an agent spills it (on ``subject`` if given)."""
    envelope = Envelope(source=Source(run_id=run_id, host="h", pid=1), seq=i + 1,
                        records=[RunEvent(time=time.time(), kind="note", step=i)])  # fmt: skip
    return OutMsg(subject or DEFAULT_SUBJECTS.data(run_id, "run"), f"{run_id}/0/h/1/n/{i}", encode(envelope), 1)


def _sealed(path: Path, broker: str, msgs: list[OutMsg]) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_sealed(path, broker, (frame(m) for m in msgs))
    return path.read_bytes()


def _stream(url: str) -> tuple[Any, int]:
    """The VIGIL stream's creation time and how many messages it ever took (the daemon's acks remove them)."""

    async def look() -> tuple[Any, int]:
        nc = await nats.connect(url)
        try:
            info = await nc.jetstream().stream_info("VIGIL")
            return info.created, info.state.last_seq
        finally:
            await nc.close()

    return asyncio.run(look())


def _clean(result: Any) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert "\x1b" not in result.stdout + result.stderr, "an escape sequence reached the terminal"


# ---- vigil push: only its own run's data subjects ------------------------------------------------------------


FOREIGN = {
    "delete": "$JS.API.STREAM.DELETE.VIGIL",
    "sql": "vigil.v1.ctl.sql",
    "alert": "vigil.v1.alerts.run",
    "kind": "vigil.v1.crafted-kind.bogus",
    "other": "vigil.v1.somebody-else.metrics",
    "escape": "vigil.v1.x\x1b[2J.metrics",
}
"""Subjects a crafted spill file's frame may name, none of them its run's data."""


def test_vigil_push_refuses_a_file_with_any_frame_off_its_runs_data_subjects_and_sends_nothing_of_it(
    process_daemon: Daemon, private_nats_server: NatsServer, tmp_path: Path
) -> None:
    """Each crafted file starts with a frame of its own run, then names another subject: nothing of it goes
    out, it stays byte for byte, and the command names the file and the subject. The good file beside them
    is delivered; the stream is the one the daemon made (a JetStream API subject would have deleted it)."""
    spill, broker = tmp_path / "crafted", broker_key(private_nats_server.url)
    created, _ = _stream(private_nats_server.url)
    kept = {}
    for n, (name, subject) in enumerate(FOREIGN.items()):
        run = f"crafted-{name}"
        path = spill / f"{run}-r0-p1-n.spill"
        kept[path] = _sealed(path, broker, [_event(run, 0), _event(run, 1, subject)])
        os.utime(path, (1000 + n, 1000 + n))  # older than the good file: tried first
    _sealed(spill / "good-r0-p1-n.spill", broker, [_event("good", i) for i in range(5)])

    pushed = vigil("push", str(spill), "--nats", private_nats_server.url, timeout=DEADLINE_S)

    assert pushed.returncode == 1, pushed.stderr
    _clean(pushed)
    for path, before in kept.items():
        assert path.read_bytes() == before, f"{path.name} is left as it was"
        line = next((line for line in pushed.stderr.splitlines() if path.name in line and "refused" in line), "")
        subject = FOREIGN[path.name.split("-")[1]].replace("\x1b", "\\x1b")
        assert subject in line, f"{path.name}: {pushed.stderr}"
    assert not (spill / "good-r0-p1-n.spill").exists()
    wait_for(
        lambda: process_daemon.scalar("select count(*) from events where run_id = 'good'") == 5, 30, "the good file"
    )
    assert process_daemon.scalar("select count(*) from events where run_id like 'crafted-%'") == 0
    assert _stream(private_nats_server.url) == (created, 5), (
        "the same stream, which took the good file's messages alone"
    )
    assert '"stream_missing"' not in process_daemon.log.read_text()


def test_vigil_push_refuses_fifos_devices_and_symbolic_links_by_kind_without_opening_them(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    spill, broker = tmp_path / "spill", broker_key(nats_server.url)
    spill.mkdir()
    os.mkfifo(spill / "fifo-r0-p1-n.spill")
    (spill / "zero-r0-p1-n.spill").symlink_to("/dev/zero")
    elsewhere = tmp_path / "elsewhere-r0-p1-n.spill"
    before = _sealed(elsewhere, broker, [_event("elsewhere", 0)])
    (spill / "link-r0-p1-n.spill").symlink_to(elsewhere)

    pushed = vigil("push", str(spill), "--nats", nats_server.url, timeout=DEADLINE_S)
    alone = vigil("push", str(spill / "fifo-r0-p1-n.spill"), "--nats", nats_server.url, timeout=DEADLINE_S)

    for result in (pushed, alone):
        assert result.returncode == 1, result.stderr
        _clean(result)
    for name, kind in [("fifo", "a FIFO"), ("zero", "a symbolic link"), ("link", "a symbolic link")]:
        assert any(f"{name}-r0-p1-n.spill" in line and kind in line for line in pushed.stderr.splitlines()), (
            name,
            pushed.stderr,
        )
    assert "fifo-r0-p1-n.spill" in alone.stderr and "a FIFO" in alone.stderr
    assert elsewhere.read_bytes() == before, "what a link points to is neither sent, marked nor removed"
    assert (spill / "link-r0-p1-n.spill").is_symlink()


def test_vigil_push_of_a_header_only_spill_file_says_it_held_nothing_and_removes_it(
    daemon: InProcessDaemon, private_nats_server: NatsServer, tmp_path: Path
) -> None:
    path = tmp_path / "empty-r0-p1-n.spill"
    path.write_bytes(sealed_header(broker_key(private_nats_server.url)))
    pushed = vigil("push", str(path), "--nats", private_nats_server.url, timeout=DEADLINE_S)
    assert pushed.returncode == 0, pushed.stderr
    _clean(pushed)
    assert "empty-r0-p1-n.spill: held no messages (a header only), removed" in pushed.stderr
    assert not path.exists()
    assert _stream(private_nats_server.url)[1] == 0


# ---- vigil verify: the manifest -----------------------------------------------------------------------------


def _checkpoint(tmp_path: Path) -> Path:
    torch = pytest.importorskip("torch")
    import trainvigil.checkpoint

    path = tmp_path / "model.pt"
    trainvigil.checkpoint.save({"w": torch.ones(3)}, path)
    return path


def _verify(path: Path, tmp_path: Path) -> Any:
    where = ["--nats", f"nats://127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "no-daemon")]
    return vigil("verify", str(path), *where, timeout=DEADLINE_S)


def test_vigil_verify_prints_the_names_a_manifest_holds_escaped(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path)
    manifest = Path(f"{path}.vigil.json")
    body = json.loads(manifest.read_text())
    body["entries"]["\x1b]0;owned\x07\x1b[2Jw"] = "0" * 64  # a name the checkpoint lacks: listed as differing
    body["root"] = "0" * 64
    manifest.write_text(json.dumps(body))
    verified = _verify(path, tmp_path)
    assert verified.returncode == 1, verified.stderr
    _clean(verified)
    assert "\\x1b]0;owned\\x07\\x1b[2Jw: expected 0000000000000000 got (absent)" in verified.stdout


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_vigil_verify_refuses_a_manifest_that_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    path = _checkpoint(tmp_path)
    manifest = Path(f"{path}.vigil.json")
    manifest.unlink()
    if kind == "fifo":
        os.mkfifo(manifest)
    else:
        manifest.symlink_to("/dev/zero")
    verified = _verify(path, tmp_path)
    assert verified.returncode == 2, verified.stderr
    _clean(verified)
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert f"{manifest} is {what}, not a regular file" in verified.stderr


# ---- vigil replay ---------------------------------------------------------------------------------------------


def test_vigil_replay_refuses_a_line_nested_100000_deep_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    deep = '{"run_id": "r", "rank": 0, "step": 2, "loss": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path.write_text('{"run_id": "r", "rank": 0, "step": 1, "loss": 1.0}\n' + deep + "\n")
    replayed = vigil("replay", str(path), timeout=DEADLINE_S)
    assert replayed.returncode == 2, replayed.stderr
    _clean(replayed)
    assert "line 2 is nested deeper than" in replayed.stderr, replayed.stderr


def test_vigil_replay_refuses_a_fifo_by_kind(tmp_path: Path) -> None:
    path = tmp_path / "recording.jsonl"
    os.mkfifo(path)
    replayed = vigil("replay", str(path), timeout=DEADLINE_S)
    assert replayed.returncode == 2, replayed.stderr
    _clean(replayed)
    assert f"{path} is a FIFO, not a regular file" in replayed.stderr


# ---- checkpoint.save in a shared directory ------------------------------------------------------------------


def test_checkpoint_save_never_writes_through_a_link_planted_where_its_manifest_goes(tmp_path: Path) -> None:
    """Someone else in a shared checkpoint directory plants links at every name the manifest could be
    written under first (the old temporary name had the saver's pid in it): none of their targets is
    touched, and the manifest is a file of its own with the checkpoint's permissions."""
    torch = pytest.importorskip("torch")
    import trainvigil.checkpoint

    victim = tmp_path / "victim"
    victim.write_text("precious")
    shared = tmp_path / "shared"
    shared.mkdir()
    path = shared / "model.pt"
    for name in (f".model.pt.vigil.json.{os.getpid()}.tmp", "model.pt.vigil.json.tmp"):
        (shared / name).symlink_to(victim)
    trainvigil.checkpoint.save({"w": torch.ones(3)}, path)
    assert victim.read_text() == "precious"
    manifest = Path(f"{path}.vigil.json")
    assert not manifest.is_symlink() and json.loads(manifest.read_text())["entries"].keys() == {"w"}
    assert manifest.stat().st_mode & 0o777 == path.stat().st_mode & 0o777
    assert sorted(p.name for p in shared.iterdir() if not p.is_symlink()) == ["model.pt", "model.pt.vigil.json"]


def test_checkpoint_save_replaces_a_link_planted_at_the_manifest_itself_without_following_it(
    tmp_path: Path,
) -> None:
    torch = pytest.importorskip("torch")
    import trainvigil.checkpoint

    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "model.pt"
    Path(f"{path}.vigil.json").symlink_to(victim)
    trainvigil.checkpoint.save({"w": torch.ones(3)}, path)
    assert victim.read_text() == "precious"
    assert not Path(f"{path}.vigil.json").is_symlink()
