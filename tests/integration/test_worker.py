"""The agent's worker in pieces: the pure batcher, the GIL pacer, and the worker against a fake publisher
(no broker), plus ``Agent.flush()`` against a real nats-server."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import nats
import pytest
from support import NatsServer, wait_for

import trainvigil
from trainvigil.agents._drops import Drops
from trainvigil.agents.options import AgentOptions
from trainvigil.agents.spill.outbox import Outbox, OutMsg, read_frame, read_sealed_header
from trainvigil.agents.spill.push import FileResult
from trainvigil.agents.transport._pacing import Pacer
from trainvigil.agents.transport.batcher import CHUNK, MAX_PAYLOAD, Batcher
from trainvigil.agents.transport.columnar import Entry
from trainvigil.agents.transport.worker import Worker
from trainvigil.schemas import DEFAULT_SUBJECTS, Envelope, Heartbeat, Record, RunEvent, Source, StepBatch, decode

SOURCE = Source(run_id="w", rank=0, world_size=1, local_rank=0, host="h", pid=1)


def _entries(n: int, start: int = 0) -> deque[Entry]:
    return deque((step, 1.0, {"loss": float(step)}) for step in range(start, start + n))


def _batcher(batch_size: int = 10_000) -> tuple[Batcher, Drops, list[str]]:
    drops, failures = Drops(), []
    return Batcher(SOURCE, batch_size, drops, lambda doing, *_: failures.append(doing)), drops, failures


def _steps_in(msgs: Sequence[OutMsg]) -> list[int]:
    out = []
    for msg in msgs:
        for record in decode(msg.payload).records:
            assert isinstance(record, StepBatch)
            out += [int.from_bytes(record.step[i : i + 8], "little") for i in range(0, len(record.step), 8)]
    return out


# ---- batcher (pure) ----------------------------------------------------------------------------


def test_pack_takes_a_chunk_per_step_and_seal_makes_one_message_of_every_row() -> None:
    batcher, drops, _ = _batcher()
    steps = _entries(3 * CHUNK + 5)
    yielded = list(batcher.pack(steps))
    assert len(yielded) == 4 and all(msgs == [] for msgs in yielded), "one slice per chunk, no batch full yet"
    assert not steps and batcher.open_rows == 3 * CHUNK + 5
    (msg,) = batcher.seal()
    assert _steps_in([msg]) == list(range(3 * CHUNK + 5))
    assert msg.subject == "vigil.v1.w.metrics" and msg.events == 3 * CHUNK + 5
    assert batcher.seal() == [] and not drops.total()


def test_pack_seals_a_batch_as_soon_as_it_holds_batch_size_rows() -> None:
    batcher, _, _ = _batcher(batch_size=100)
    msgs = [m for chunk in batcher.pack(_entries(250)) for m in chunk]
    assert [m.events for m in msgs] == [100, 100]
    assert _steps_in([*msgs, *batcher.seal()]) == list(range(250))


def test_message_ids_are_unique_and_carry_the_source_and_a_random_nonce() -> None:
    first, _, _ = _batcher(batch_size=10)
    second, _, _ = _batcher(batch_size=10)
    ids = [m.msg_id for chunk in first.pack(_entries(30)) for m in chunk]
    assert len(set(ids)) == 3 and all(i.startswith(f"w/0/h/1/{first.nonce}/") for i in ids)
    assert first.nonce != second.nonce


def test_records_go_out_grouped_by_subject_in_order() -> None:
    batcher, _, _ = _batcher()
    hb = Heartbeat(time=1.0, last_step=None, buffered=0, spilled_bytes=0, connected=True, dropped={})
    records: deque[Record] = deque([RunEvent(time=1.0, kind="a"), hb, RunEvent(time=2.0, kind="b")])
    msgs = batcher.records(records)
    assert not records
    assert [(m.subject, m.events) for m in msgs] == [("vigil.v1.w.run", 2), ("vigil.v1.w.hb", 1)]
    run = decode(msgs[0].payload)
    kinds = [r.kind if isinstance(r, RunEvent) else type(r).__name__ for r in run.records]
    assert isinstance(run, Envelope) and kinds == ["a", "b"]


def test_a_batch_larger_than_the_broker_takes_is_cut_into_messages_under_the_limit() -> None:
    batcher, drops, _ = _batcher()
    wide = {f"metric_{i}": float(i) for i in range(200)}
    steps: deque[Entry] = deque((step, 1.0, dict(wide)) for step in range(1000))
    msgs = [m for chunk in batcher.pack(steps) for m in chunk] + batcher.seal()
    assert len(msgs) > 1 and all(len(m.payload) <= MAX_PAYLOAD for m in msgs)
    assert _steps_in(msgs) == list(range(1000)) and not drops.total()


# ---- pacer (pure) ------------------------------------------------------------------------------


def test_pacer_sleeps_once_its_budget_ran_and_starts_afresh_after_a_rest() -> None:
    now = [0.0]
    slept: list[float] = []
    pacer = Pacer(budget=0.001, pause=0.0001, clock=lambda: now[0], sleep=slept.append)
    now[0] = 0.0009
    pacer()
    assert slept == []
    now[0] = 0.0011
    pacer()
    assert slept == [0.0001]
    now[0] = 0.0030
    pacer.rested()
    now[0] = 0.0035
    pacer()
    assert slept == [0.0001], "a rest (a blocking wait) starts a new budget"


# ---- outbox.persist (pure, a temp file) -------------------------------------------------------


def _msg(i: int) -> OutMsg:
    return OutMsg("vigil.v1.w.metrics", f"id/{i}", bytes([i]) * 10, 1)


def test_persist_moves_memory_to_disk_keeping_fifo_order_with_what_was_spilled(tmp_path: Path) -> None:
    box = Outbox(max_memory_bytes=3 * _msg(0).size, spill_path=tmp_path / "live", max_spill_bytes=10_000)
    for i in range(6):  # 0-2 in memory, 3-5 spilled
        assert box.push(_msg(i))
    box.peek(3)
    box.pop(2)  # 0 and 1 acked; 2 in memory, older than the file's 3-5
    assert box.persist()
    with open(tmp_path / "live", "rb") as f:  # what a kill now would leave
        read_sealed_header(f)
        assert [m.msg_id for m, _ in iter(lambda: read_frame(f), None)] == ["id/2", "id/3", "id/4", "id/5"]
    assert box.pending_events == 4
    assert [m.msg_id for m in box.peek(10)] == ["id/2", "id/3", "id/4", "id/5"]


def test_persist_with_everything_on_disk_already_keeps_the_file_as_it_is(tmp_path: Path) -> None:
    box = Outbox(max_memory_bytes=10_000, spill_path=tmp_path / "live", max_spill_bytes=10_000)
    for i in range(3):
        box.push(_msg(i), to_disk=True)
    inode = (tmp_path / "live").stat().st_ino
    assert box.persist() and box.persist()
    assert (tmp_path / "live").stat().st_ino == inode, "not copied"
    assert [m.msg_id for m in box.peek(10)] == ["id/0", "id/1", "id/2"]


def test_persist_refuses_past_max_spill_bytes_and_keeps_memory(tmp_path: Path) -> None:
    box = Outbox(max_memory_bytes=10_000, spill_path=tmp_path / "live", max_spill_bytes=10)
    box.push(_msg(0))
    assert not box.persist()
    assert box.pending_events == 1 and box.spilled_bytes == 0


# ---- the worker against a fake publisher -------------------------------------------------------


class FakePublisher:
    """A broker in memory: ``up`` says whether it answers; each round acknowledges at most ``ack_limit``."""

    def __init__(self, up: bool = True, ack_limit: int | None = None) -> None:
        self.up = up
        self.ack_limit = ack_limit
        self.published: list[OutMsg] = []
        self.rounds = 0
        self.round_times: list[float] = []  # time.monotonic() at each round's start
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: Callable[[], None] = lambda: None

    @property
    def connected(self) -> bool:
        return self.up

    @property
    def ever_connected(self) -> bool:
        return bool(self.published) or self.up

    @property
    def unreachable(self) -> bool:
        return not self.ever_connected

    async def run(self, changed: Callable[[], None]) -> None:
        self._loop, self._changed = asyncio.get_running_loop(), changed
        await asyncio.Future()

    def set_up(self, up: bool) -> None:
        """From the test's thread: the broker comes or goes."""
        self.up = up
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._changed)

    async def publish(self, msgs: Sequence[OutMsg], timeout: float) -> tuple[int, BaseException | None]:
        self.rounds += 1
        self.round_times.append(time.monotonic())
        if not self.up:
            return 0, ConnectionError("down")
        acked = len(msgs) if self.ack_limit is None else min(self.ack_limit, len(msgs))
        self.published += msgs[:acked]
        return acked, None if acked == len(msgs) else TimeoutError("no ack")

    async def deliver_file(self, path: Path, only_for: str) -> FileResult:
        return FileResult(path, skipped=True)


class Rig:
    """A worker fed through its two deques, as an Agent feeds it."""

    def __init__(self, tmp_path: Path, publisher: FakePublisher, **options: Any) -> None:
        opts = AgentOptions(run_id="w", spill_dir=tmp_path, heartbeat_interval=3600, **options)
        self.steps: deque[Entry] = deque()
        self.records: deque[Record] = deque()
        self.drops = Drops()
        self.publisher = publisher
        self.armed = False
        self.worker = Worker(
            opts, SOURCE, self.steps, self.records, self.drops, lambda: None, publisher, wake_on_log=self._arm
        )
        self.worker.start()
        wait_for(lambda: self.worker._loop is not None, 10, "the worker's loop")

    def _arm(self, at: int) -> None:
        self.armed = at == 0

    def log(self, first: int, n: int) -> None:
        """As ``Agent.log`` does: append, and wake a worker sleeping through a quiet spell."""
        self.steps.extend(_entries(n, first))
        if self.armed:
            self.worker.wake()

    def log_steadily(self, n: int) -> None:
        """A step every 5 ms (the loop's pace, part of the setup), then wait until all ``n`` are published."""
        for step in range(n):
            self.log(step, 1)
            time.sleep(0.005)
        wait_for(lambda: self.published_steps() == list(range(n)), 10, "every step")

    def published_steps(self) -> list[int]:
        return _steps_in([m for m in self.publisher.published if m.subject.endswith(".metrics")])


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(publisher: FakePublisher, **options: Any) -> Rig:
        made.append(Rig(tmp_path, publisher, **options))
        return made[-1]

    yield make
    for r in made:
        r.worker.request_close(0.5, "ok")
        r.worker.thread.join(10)


def test_flush_returns_true_once_everything_logged_before_it_is_acknowledged(rig: Callable[..., Rig]) -> None:
    r = rig(FakePublisher(), flush_interval=3600)  # only flush() seals the open batch
    r.log(0, 1000)
    assert r.worker.flush(10)
    assert r.published_steps() == list(range(1000))
    assert r.worker.stats()["delivered_events"] >= 1000


def test_flush_while_the_broker_is_away_puts_everything_on_disk_then_sends_it_on_reconnect(
    rig: Callable[..., Rig],
) -> None:
    fake = FakePublisher(up=False)
    r = rig(fake, flush_interval=3600)
    r.log(0, 500)
    assert r.worker.flush(10), "on disk counts as safe"
    assert r.worker.stats()["spilled_bytes"] > 0 and fake.published == []
    fake.set_up(True)
    wait_for(lambda: r.published_steps() == list(range(500)), 10, "the spilled steps, in order")


def test_flush_makes_everything_safe_on_disk_while_the_broker_acknowledges_nothing(
    rig: Callable[..., Rig], tmp_path: Path
) -> None:
    """A broker that answers but stores nothing (no stream yet: the daemon is not up) is as good as away:
    what is held goes to the spill file, and flush() is true once it is there."""
    r = rig(FakePublisher(ack_limit=0), retry_wait_initial=0.01, retry_wait_max=0.05)
    r.log(0, 10)
    assert r.worker.flush(5)
    assert r.worker.stats()["pending_events"] >= 10
    [live] = r.worker.options.spill_dir.glob("*.live")
    with open(live, "rb") as f:
        read_sealed_header(f)
        steps = [m for m, _ in iter(lambda: read_frame(f), None) if m.subject.endswith(".metrics")]
    assert len(steps) == 1, "the message of the ten steps is on disk"


def test_flush_gives_up_at_its_deadline_when_nothing_is_acknowledged_nor_can_be_kept(rig: Callable[..., Rig]) -> None:
    r = rig(FakePublisher(ack_limit=0), retry_wait_initial=0.01, retry_wait_max=0.05, max_spill_bytes=0)
    r.log(0, 10)
    started = time.monotonic()
    assert not r.worker.flush(0.3)
    assert 0.25 < time.monotonic() - started < 5


def test_a_partly_acknowledged_round_is_retried_until_everything_is_delivered_in_order(
    rig: Callable[..., Rig],
) -> None:
    fake = FakePublisher(ack_limit=1)
    r = rig(fake, batch_size=10, flush_interval=3600, retry_wait_initial=0.001, retry_wait_max=0.002)
    r.log(0, 100)
    wait_for(lambda: r.published_steps() == list(range(100)), 10, "all ten messages acknowledged, in order")
    assert fake.rounds >= 10, "ten messages, one acknowledged per round"


def test_a_stalled_round_is_retried_after_the_backoff_not_at_once(rig: Callable[..., Rig]) -> None:
    """The first round goes out without the retry policy; once it stalls, it counts as the policy's first
    attempt: the second round waits the initial backoff, and later ones wait longer."""
    fake = FakePublisher(ack_limit=0)
    r = rig(fake, retry_wait_initial=0.1, retry_wait_max=0.4, flush_interval=3600)
    r.log(0, 10)
    r.worker.wake()
    wait_for(lambda: fake.rounds >= 4, 10, "four rounds, none acknowledged")
    gaps = [b - a for a, b in itertools.pairwise(fake.round_times[:4])]
    assert gaps[0] >= 0.1 * 0.95, f"the first retry came {gaps[0]:.3f} s after the stalled round, not after 0.1 s"
    assert gaps[2] >= 0.2 * 0.95, f"the backoff grows: {gaps}"
    fake.ack_limit = None
    assert r.worker.flush(10)  # packs the steps (safe on disk at once: nothing was acknowledged lately)
    wait_for(lambda: r.published_steps() == list(range(10)), 10, "the ten steps once acks come")


def test_the_worker_sleeps_until_woken_instead_of_polling(rig: Callable[..., Rig]) -> None:
    """With nothing to do it blocks: no publish rounds, no loop iterations, until work comes."""
    fake = FakePublisher()
    r = rig(fake, flush_interval=3600)
    # Its first pass pushes a heartbeat, which the pump may publish after the loop is asleep: wait for that too.
    wait_for(lambda: r.worker._asleep and fake.rounds >= 1 and not len(r.worker._outbox), 10, "the worker to block")
    rounds = fake.rounds
    time.sleep(0.2)  # nothing may happen meanwhile: this is the behaviour under test, not a wait for it
    assert fake.rounds == rounds and r.worker._asleep
    r.records.append(RunEvent(time=1.0, kind="e"))
    r.worker.wake()
    wait_for(lambda: any(m.subject.endswith(".run") for m in fake.published), 10, "the event to go out")


def _passes(worker: Worker) -> list[float]:
    """Counts the worker loop's passes from now on (each pass packs first): their times, appended as they come."""
    passes: list[float] = []
    pack = worker._pack

    async def counted() -> int:
        passes.append(time.monotonic())
        return await pack()

    worker._pack = counted  # type: ignore[method-assign]  # an instance attribute, looked up every pass
    return passes


def test_a_quiet_worker_sleeps_until_the_next_step_wakes_it(rig: Callable[..., Rig]) -> None:
    """No step for a whole flush interval and nothing left to seal: the worker stops waking every flush interval
    (an idle or slow loop's agent wakes per heartbeat, not 4 times a second) until ``log()`` wakes it."""
    fake = FakePublisher()
    r = rig(fake, flush_interval=0.02)
    r.log(0, 5)
    wait_for(lambda: r.published_steps() == list(range(5)), 10, "the first steps")
    wait_for(lambda: r.armed, 10, "the worker to sleep through the quiet spell")
    passes = _passes(r.worker)
    time.sleep(1.0)  # 50 flush intervals: nothing may happen meanwhile (the behaviour under test, not a wait)
    assert passes == [] and r.armed, "no pass while quiet (the old loop made one per flush interval)"
    r.log(5, 1)
    wait_for(lambda: r.published_steps() == list(range(6)), 10, "the step after the quiet spell")
    assert len(passes) <= 3, passes  # woken (packs), sealed a flush interval later, one empty pass, asleep again
    wait_for(lambda: r.armed, 10, "the worker to sleep again")


def test_a_steady_logger_still_gets_one_message_per_flush_interval_not_one_per_step(rig: Callable[..., Rig]) -> None:
    """Steps every 5 ms with a 50 ms flush interval: never quiet, so steps are batched as before."""
    fake = FakePublisher()
    r = rig(fake, flush_interval=0.05)
    r.log_steadily(200)
    messages = [m for m in fake.published if m.subject.endswith(".metrics")]
    assert len(messages) <= 60, f"{len(messages)} messages for 200 steps over >=1 s: batching is lost"


def test_a_slow_loops_every_step_is_published_between_its_quiet_spells(rig: Callable[..., Rig]) -> None:
    """Between two steps of a slow loop the thread sleeps through a quiet spell until ``log()`` wakes it; each
    step goes out after the wake, in order."""
    fake = FakePublisher()
    r = rig(fake, flush_interval=0.02, ack_timeout=0.4)
    for step in range(5):
        r.log(step, 1)
        published = list(range(step + 1))
        wait_for(lambda: r.published_steps() == published, 10, f"step {step}")  # noqa: B023 (waited for here)
        wait_for(lambda: r.armed, 10, "the worker to sleep through a quiet spell")


def test_each_flush_returns_once_the_step_before_it_is_published(rig: Callable[..., Rig]) -> None:
    fake = FakePublisher()
    r = rig(fake, flush_interval=0.05)
    for step in range(20):
        r.log(step, 1)
        assert r.worker.flush(10)
    assert r.published_steps() == list(range(20))


# ---- Agent.flush against a real nats-server ----------------------------------------------------


async def _create_stream(url: str) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name="VIGIL", subjects=DEFAULT_SUBJECTS.stream_subjects)
    finally:
        await nc.close()


def test_agent_flush_against_a_real_broker_and_after_close(private_nats_server: NatsServer, tmp_path: Path) -> None:
    asyncio.run(_create_stream(private_nats_server.url))
    agent = trainvigil.init(run_id="flush", nats_url=private_nats_server.url, spill_dir=tmp_path, flush_interval=3600)
    # flush() is also True once the steps are on the spill file while the broker is away: a connection that did not
    # open in time on a loaded machine would make that the case tested, so the broker is reached first.
    wait_for(lambda: agent.stats()["connected"], 30, "the agent to reach the broker")
    for step in range(5000):
        agent.log(step, loss=1.0)
    assert agent.flush(30)
    assert agent.stats()["delivered_events"] >= 5000 and agent.stats()["pending_events"] == 0
    assert agent.close(timeout=10)
    assert agent.flush(1), "after close: what close() returned"


def test_a_real_agent_steady_then_slow_loses_nothing(private_nats_server: NatsServer, tmp_path: Path) -> None:
    """Steady steps, then a slow loop's quiet spells between steps: every step is acknowledged, nothing dropped."""
    asyncio.run(_create_stream(private_nats_server.url))
    agent = trainvigil.init(run_id="held", nats_url=private_nats_server.url, spill_dir=tmp_path, flush_interval=0.05)
    for step in range(210):
        agent.log(step, loss=1.0)
        time.sleep(0.005 if step < 200 else 0.2)  # the loop's pace, part of the setup: steady, then slow
    assert agent.flush(30)
    stats = agent.stats()
    assert agent.close(timeout=10)
    assert stats["delivered_events"] >= 210 and stats["pending_events"] == 0 and not stats["dropped"], stats


def test_flush_never_raises_from_any_thread(tmp_path: Path) -> None:
    agent = trainvigil.init(run_id="flush2", nats_url="nats://127.0.0.1:1", spill_dir=tmp_path)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(agent.flush(5))) for _ in range(3)]
    for step in range(100):
        agent.log(step, loss=1.0)
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [True, True, True], "no broker: everything was put on disk"
    agent.close(timeout=0.5)
