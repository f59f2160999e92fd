"""The agent's outbox (``agents/spill/outbox.py``): FIFO across memory and spill file, byte limits, event counts."""

from __future__ import annotations

from pathlib import Path

from trainvigil.agents.spill.outbox import Outbox, OutMsg, sealed_header


def _msg(i: int, payload_size: int = 20, events: int = 1) -> OutMsg:
    return OutMsg(subject="s.x", msg_id=f"id{i:03d}", payload=bytes([i % 256]) * payload_size, events=events)


def _drain(box: Outbox, per_round: int = 2) -> list[OutMsg]:
    out = []
    while len(box):
        got = box.peek(per_round)
        assert got, "peek returned nothing while messages are held"
        out += got
        box.pop(len(got))
    return out


def test_outbox_keeps_fifo_order_across_memory_spill_and_memory_again(tmp_path: Path) -> None:
    spill = tmp_path / "spill" / "agent.spill"
    box = Outbox(max_memory_bytes=3 * _msg(0).size, spill_path=spill, max_spill_bytes=10_000)
    for i in range(3):
        assert box.push(_msg(i))
    assert not spill.exists()
    assert box.spilled_bytes == 0
    for i in range(3, 8):
        assert box.push(_msg(i))
    assert spill.exists()
    assert box.spilled_bytes > 0
    assert box.memory_bytes == 3 * _msg(0).size
    first = box.peek(2)
    assert [m.msg_id for m in first] == ["id000", "id001"]
    box.pop(2)
    # Memory has room again, but order demands the new message goes behind the spilled ones.
    assert box.push(_msg(8))
    drained = first + _drain(box)
    assert [m.msg_id for m in drained] == [f"id{i:03d}" for i in range(9)]
    assert [m.payload for m in drained] == [_msg(i).payload for i in range(9)]
    assert not spill.exists()
    assert box.spilled_bytes == 0
    assert box.memory_bytes == 0
    # Drained: the next message goes to memory, not to a new spill file.
    assert box.push(_msg(9))
    assert not spill.exists()
    assert [m.msg_id for m in box.peek(5)] == ["id009"]


def test_outbox_to_disk_spills_while_memory_has_room_and_holds_in_memory_when_it_cannot_write(
    tmp_path: Path,
) -> None:
    box = Outbox(max_memory_bytes=10_000, spill_path=tmp_path / "a.live", max_spill_bytes=10_000)
    assert box.push(_msg(0), to_disk=True) and box.push(_msg(1))  # behind the spilled one: on disk too
    assert box.memory_bytes == 0 and box.pending_events == 2 and (tmp_path / "a.live").exists()
    assert [m.msg_id for m in _drain(box)] == ["id000", "id001"]
    (tmp_path / "file").touch()
    nowhere = Outbox(max_memory_bytes=10_000, spill_path=tmp_path / "file" / "a.live", max_spill_bytes=10_000)
    assert nowhere.push(_msg(2), to_disk=True)
    assert nowhere.memory_bytes == _msg(2).size and nowhere.spilled_bytes == 0
    assert [m.msg_id for m in _drain(nowhere)] == ["id002"]


def test_outbox_spill_round_trips_subject_id_payload_and_events(tmp_path: Path) -> None:
    box = Outbox(max_memory_bytes=0, spill_path=tmp_path / "a.spill", max_spill_bytes=10_000)
    msg = OutMsg(subject="vigil.v1.run-ü.metrics", msg_id="r/0/h/1/ü", payload=b"\x00\xff" * 50, events=42)
    assert box.push(msg)
    assert box.memory_bytes == 0
    assert box.peek(1) == [msg]


def test_outbox_peek_does_not_remove(tmp_path: Path) -> None:
    box = Outbox(max_memory_bytes=1000, spill_path=tmp_path / "a.spill", max_spill_bytes=1000)
    box.push(_msg(1))
    assert box.peek(3) == box.peek(3) == [_msg(1)]
    assert len(box) == 1


def test_outbox_push_returns_false_past_max_spill_bytes(tmp_path: Path) -> None:
    spill = tmp_path / "a.spill"
    size_on_disk = 16 + len("s.x") + len("id000") + 20
    box = Outbox(max_memory_bytes=0, spill_path=spill, max_spill_bytes=3 * size_on_disk)
    assert [box.push(_msg(i)) for i in range(5)] == [True, True, True, False, False]
    assert box.spilled_bytes == 3 * size_on_disk
    assert spill.stat().st_size == len(sealed_header("")) + 3 * size_on_disk  # a sealed file's header first
    assert box.pending_events == 3
    assert [m.msg_id for m in _drain(box)] == ["id000", "id001", "id002"]


def test_outbox_pending_events_counts_memory_and_spill(tmp_path: Path) -> None:
    box = Outbox(max_memory_bytes=2 * _msg(0).size, spill_path=tmp_path / "a.spill", max_spill_bytes=10_000)
    for i, events in enumerate([5, 7, 11, 13]):
        box.push(_msg(i, events=events))
    assert box.pending_events == 36
    assert box.spilled_bytes > 0
    box.peek(3)  # loads one message back from disk
    assert box.pending_events == 36
    box.pop(1)
    assert box.pending_events == 31
    box.pop(2)
    assert box.pending_events == 13
    box.peek(1)
    box.pop(1)
    assert box.pending_events == 0
    assert len(box) == 0


def test_outbox_discard_spill_forgets_disk_events_and_removes_the_file(tmp_path: Path) -> None:
    spill = tmp_path / "a.spill"
    box = Outbox(max_memory_bytes=_msg(0).size, spill_path=spill, max_spill_bytes=10_000)
    box.push(_msg(0, events=2))
    box.push(_msg(1, events=3))
    assert spill.exists()
    box.discard_spill()
    assert not spill.exists()
    assert box.pending_events == 2
    assert box.spilled_bytes == 0
