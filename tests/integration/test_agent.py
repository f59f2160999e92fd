"""The agent (``agents/agent.py``) with no broker to reach: it never raises or blocks, counts what it drops,
closes within its deadline, and a forked child gets a GIL sampler of its own (in a fresh interpreter)."""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

import trainvigil
from trainvigil.agents import Agent

_NO_BROKER = "nats://127.0.0.1:1"


@pytest.fixture
def offline_agent(tmp_path: Path) -> Iterator[Agent]:
    agent = trainvigil.init(run_id="offline", nats_url=_NO_BROKER, spill_dir=tmp_path / "spill", flush_interval=0.05)
    try:
        yield agent
    finally:
        agent.close(timeout=0.1)


def test_log_with_bad_values_and_steps_never_raises_and_counts_drops(offline_agent: Agent) -> None:
    offline_agent.log(0, loss="not a number")  # type: ignore[arg-type]
    offline_agent.log(1, loss=None)  # type: ignore[arg-type]
    offline_agent.log("two", loss=2.0)  # type: ignore[arg-type]
    offline_agent.log(3.5, loss=3.0)  # type: ignore[arg-type]
    offline_agent.log(4, loss=object(), grad_norm=1.0)  # type: ignore[arg-type]
    offline_agent.event("eval", step=None, acc=0.5)
    assert offline_agent.close(timeout=0.5) is False
    dropped = offline_agent.stats()["dropped"]
    assert dropped["bad_step"] == 2
    assert dropped["bad_value"] >= 2
    assert dropped["close_timeout"] >= 1


@pytest.mark.serial
def test_ten_thousand_log_calls_never_block_without_a_broker(offline_agent: Agent) -> None:
    longest = 0.0
    clock = time.perf_counter
    for step in range(10_000):
        t0 = clock()
        offline_agent.log(step, loss=1.0 / (step + 1), lr=1e-3)
        longest = max(longest, clock() - t0)
    assert longest < 0.05, f"slowest log() took {longest * 1000:.1f} ms"


@pytest.mark.serial
def test_log_wakes_an_agent_thread_asleep_through_a_quiet_spell_at_any_moment_of_it(tmp_path: Path) -> None:
    """Once no step came for a flush interval, the agent's thread sleeps until a heartbeat is due (an hour here)
    and the next ``log()`` wakes it. Steps logged at every moment of that hand-over (as it falls asleep, asleep,
    just after a flush) are each packed within the deadline, never left for the heartbeat."""
    agent = trainvigil.init(
        run_id="quiet", nats_url=_NO_BROKER, spill_dir=tmp_path / "spill", flush_interval=0.02, heartbeat_interval=3600
    )
    rng = random.Random(0)
    asleep = 0
    try:
        for step in range(40):
            time.sleep(rng.uniform(0.0, 0.05))  # the loop's pace, around the flush interval: part of the setup
            asleep += agent._wake_at == 0  # the thread said: wake me at the next step
            agent.log(step, loss=1.0)
            wait_for(lambda: not agent._steps, 5, f"step {step} to be packed")
    finally:
        agent.close(timeout=0.1)
    assert asleep >= 8, f"the thread slept through a quiet spell before only {asleep} of 40 steps"


@pytest.mark.serial
def test_close_without_a_broker_returns_false_within_deadline_and_counts_close_timeout(offline_agent: Agent) -> None:
    for step in range(100):
        offline_agent.log(step, loss=1.0)
    t0 = time.monotonic()
    delivered = offline_agent.close(timeout=0.5)
    elapsed = time.monotonic() - t0
    assert delivered is False
    assert elapsed < 3.0
    stats = offline_agent.stats()
    assert stats["connected"] is False
    assert stats["dropped"]["close_timeout"] >= 100
    assert stats["delivered_events"] == 0
    # Closing twice is safe and gives the same answer.
    assert offline_agent.close(timeout=0.5) is False


def test_log_after_close_is_dropped_as_closed_without_raising(offline_agent: Agent) -> None:
    offline_agent.close(timeout=0.2)
    offline_agent.log(1, loss=1.0)
    offline_agent.event("late")
    assert offline_agent.stats()["dropped"]["closed"] == 2


def test_disabled_agent_is_a_no_op(tmp_path: Path) -> None:
    agent = trainvigil.init(run_id="off", nats_url=_NO_BROKER, enabled=False, spill_dir=tmp_path)
    agent.log(0, loss=1.0)
    agent.event("x")
    assert agent.close(timeout=0.1) is True
    assert agent.stats()["connected"] is False


@pytest.mark.parametrize(
    ("raised", "status"),
    [(None, "ok"), (KeyboardInterrupt, "ok"), (ValueError, "error")],
    ids=["clean", "ctrl-c", "crash"],
)
def test_leaving_the_with_block_ends_the_run_as_ok_unless_it_crashed(
    offline_agent: Agent, monkeypatch: pytest.MonkeyPatch, raised: type[BaseException] | None, status: str
) -> None:
    """Ctrl-C (or a canary runner's SIGINT) stops a run; only a real exception makes it an error (run_failed)."""
    closes: list[tuple[str, str]] = []
    worker = offline_agent._worker
    assert worker is not None
    real = worker.request_close

    def recording_close(timeout: float, st: str, crash: str) -> None:
        closes.append((st, crash))
        return real(timeout, st, crash)

    monkeypatch.setattr(worker, "request_close", recording_close)
    with pytest.raises(raised) if raised else contextlib.nullcontext(), offline_agent:
        if raised:
            raise raised("stop")
    assert closes and closes[0][0] == status
    assert bool(closes[0][1]) is (status == "error")


# In a fresh interpreter: pytest's own process may hold threads of other tests' libraries by now
# (JAX's backend warns on os.fork(), and the suite turns warnings into errors).
FORK_SCRIPT = """
import os, sys
import trainvigil
agent = trainvigil.init(run_id="fork-gil", nats_url="nats://127.0.0.1:1", gil=True, gil_interval=0.1,
                        spill_dir=sys.argv[1])
try:
    parent = agent._gil
    assert parent is not None and parent.running
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's exit handlers
        child = agent._gil
        ok = child is not None and child is not parent and child.running and not parent.running
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    print("child", os.read(r, 1).decode(), flush=True)
    os.waitpid(pid, 0)
    print("parent-running", parent.running, flush=True)
finally:
    agent.close(timeout=0.2)
print("after-close", parent.running, flush=True)
"""


def test_agent_runs_a_sampler_and_a_forked_child_gets_its_own(tmp_path: Path) -> None:
    """gil=True starts the sampler with the agent; after fork the child samples on a thread of its own."""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", FORK_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "child 1" in lines, "the child runs a sampler of its own, and not the parent's"
    assert "parent-running True" in lines, "the parent keeps its sampler"
    assert lines[-1] == "after-close False", "close() stops the sampler"
