"""Pure logic of the GIL sampler (summary, report, wire record, options) and the gil_contention detector."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest

from trainvigil.agents.gil import GilResult, ThreadResult, advice, render
from trainvigil.agents.gil._probe import BUSY_WAIT, Probe, WakeTimer, summarize
from trainvigil.agents.options import resolve
from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors.gil_contention import GilContention, GilContentionSettings
from trainvigil.errors import ConfigError
from trainvigil.gil import detect_gil_contention, profile_gil
from trainvigil.schemas import GilSample, Record, Source, ThreadShare

MS = 1e-3


def test_summary_percentiles_and_held_estimate() -> None:
    """held = W + B(1 - W): waits of a switch interval after each sleep mean ~fully held, not W = 0.5."""
    waits = [5 * MS] * 100
    s = summarize(waits, elapsed=1.0)
    assert s.wait_share == pytest.approx(0.5) and s.busy_share == 1.0 and s.held == 1.0
    quiet = summarize([0.0] * 98 + [20 * MS] * 2, elapsed=1.0)
    assert quiet.wait_p50 == quiet.wait_p90 == 0.0 and quiet.wait_max == quiet.wait_p99 == 20 * MS, (
        "nearest-rank percentiles"
    )
    assert quiet.busy_share == pytest.approx(0.02) and quiet.held == pytest.approx(0.04 + 0.02 * 0.96)
    assert summarize([BUSY_WAIT] * 10, 1.0).busy_share == 0.0, "exactly the threshold is not busy"
    assert summarize([], 1.0).samples == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_the_wake_timer_sleeps_its_time_and_says_the_kernels_lateness_in_whole_periods() -> None:
    import time

    timer = WakeTimer()
    assert timer.available
    try:
        for seconds in (0.002, 0.0005, 0.004):
            t0 = time.perf_counter()
            late = timer.sleep(seconds)
            took = time.perf_counter() - t0
            assert took >= seconds * 0.999, (seconds, took)
            periods = late / WakeTimer.period
            assert late >= 0 and abs(periods - round(periods)) < 1e-6, late
            assert late <= took - seconds + WakeTimer.period, "the kernel's part is inside the whole lateness"
    finally:
        timer.close()


def test_a_probe_whose_timer_fails_goes_on_with_the_run_queue_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = Probe(mean_sleep=0.001, seed=1)
    probe.open()
    try:
        timer = probe._timer
        if timer is None:
            pytest.skip("no timerfd here: the probe runs on the clock already")
        # Arming fails from now on: the probe must notice and fall back.
        monkeypatch.setattr(timer, "_settime", lambda *args: -1)
        assert probe.once() == 0.0, "that sleep's lateness is unknown"
        clock = probe._clock
        assert probe._timer is None and not timer.available, "the timer is closed"
        assert probe.corrects_run_queue == (clock is not None and clock.available)
        assert all(probe.once() >= 0.0 for _ in range(5))
    finally:
        probe.close()


def _result(**kw: object) -> GilResult:
    base: dict[str, object] = dict(
        name="t",
        started=0.0,
        elapsed=1.0,
        samples=100,
        wait_p50=5.2 * MS,
        wait_p90=6 * MS,
        wait_p99=7 * MS,
        wait_max=8 * MS,
        busy_share=1.0,
        wait_share=0.5,
        held=0.97,
        switch_interval=5 * MS,
        gil_enabled=True,
        attributed=True,
        threads=[
            ThreadResult(
                "loader", 7, 0.9, "python", "S", 0.9, 0.9, [("parse (data.py:10)", 0.8)], [("run;parse", 0.8)]
            ),
            ThreadResult("MainThread", 1, 0.1, "native", "R", 0.8, 0.1),
        ],
    )
    base.update(kw)
    return GilResult(**base)  # type: ignore[arg-type]


def test_report_shows_bars_waits_hot_functions_and_advice() -> None:
    text = render(_result())
    assert "GIL held ≈ 97%" in text and "p50 5.2 ms" in text and "p99 7.0 ms" in text
    assert "loader" in text and "█" in text and "parse (data.py:10)" in text
    assert "move it to processes" in text and "loader (90%)" in text


def test_advice_per_pattern() -> None:
    assert advice(_result(held=0.02, wait_p50=0.0, wait_p99=0.1 * MS, threads=[])) == []
    long_holds = advice(_result(held=0.4, wait_p50=0.05 * MS, wait_p99=40 * MS, threads=[]))
    assert len(long_holds) == 1 and "release the GIL in the C code" in long_holds[0]
    queue = " ".join(advice(_result(wait_p50=15 * MS)))
    assert "fewer" in queue and "free-threaded" in queue
    assert "free-threaded build" in advice(_result(gil_enabled=False))[0]


def test_result_becomes_a_wire_record_that_round_trips() -> None:
    record = _result().to_record(123.0)
    assert record.held == 0.97 and record.threads[0] == ThreadShare(
        name="loader", tid=7, share=0.9, state="python", top_functions=["parse (data.py:10)"]
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(record), type=Record) == record


def test_gil_options_from_arguments_and_environment() -> None:
    opts, _ = resolve("r", None, None, {}, env={"VIGIL_GIL": "1", "VIGIL_GIL_INTERVAL": "0.5"})
    assert opts.gil is True and opts.gil_interval == 0.5
    assert resolve("r", None, None, {"gil": False}, env={"VIGIL_GIL": "1"})[0].gil is False
    assert resolve("r", None, None, {}, env={})[0].gil is False
    with pytest.raises(ConfigError, match="gil_interval"):
        resolve("r", None, None, {"gil_interval": 0}, env={})


def test_context_manager_and_decorator_report_and_return_numbers() -> None:
    """The public API: a report on exit, numbers on the result, the function's value unchanged."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    out = io.StringIO()
    busy = threading.Thread(target=spin, name="busy-api")
    busy.start()
    try:
        with detect_gil_contention("api", file=out) as found:
            stop.wait(0.6)
    finally:
        stop.set()
        busy.join()
    r = found.result
    assert r is not None and r.samples > 20 and r.held > 0.5, r
    assert r.threads[0].name == "busy-api", r.threads
    assert "GIL contention: 'api'" in out.getvalue() and "busy-api" in out.getvalue()

    @profile_gil(report=False)
    def work(n: int) -> int:
        threading.Event().wait(0.2)
        return n * 2

    assert work(21) == 42
    assert work.gil_result is not None and work.gil_result.samples > 5 and work.gil_result.held < 0.5  # type: ignore[attr-defined]


def _sample(t: float, held: float, p50: float, *, enabled: bool = True) -> GilSample:
    return GilSample(
        time=t,
        period=1.0,
        samples=100,
        wait_p50=p50,
        wait_p90=p50,
        wait_p99=p50,
        wait_max=p50,
        busy_share=held,
        wait_share=held / 2,
        held=held,
        switch_interval=5 * MS,
        gil_enabled=enabled,
        threads=[ThreadShare(name="loader", share=0.9, state="python", top_functions=["parse (data.py:10)"])],
    )


def _batch(*samples: tuple[int, GilSample]) -> IngestBatch:
    return IngestBatch(gil_samples=[(Source(run_id="r", rank=rank), s) for rank, s in samples])


HOT, COOL = (0.95, 8 * MS), (0.2, 0.1 * MS)


def test_detector_pages_after_three_contended_periods_and_names_the_thread() -> None:
    d = GilContention(GilContentionSettings())
    assert d(_batch((0, _sample(1, *HOT)), (0, _sample(2, *HOT)))) == []
    [page] = d(_batch((0, _sample(3, *HOT))))
    assert page.severity == "page" and page.state == "open" and page.step is None
    assert page.value == 0.95 and page.threshold == 0.7
    assert "loader 90%" in page.message and "parse (data.py:10)" in page.message and "num_workers" in page.message
    assert d(_batch((0, _sample(4, *HOT)))) == [], "one episode, not a storm"
    cleared = d(_batch(*[(0, _sample(5 + i, *COOL)) for i in range(3)]))
    assert [a.state for a in cleared] == ["cleared"] and cleared[0].episode == page.episode


def test_detector_needs_both_hold_and_wait_and_consecutive_periods() -> None:
    d = GilContention(GilContentionSettings())
    busy_but_no_queue = [(0, _sample(i, 0.95, 1 * MS)) for i in range(5)]
    assert d(_batch(*busy_but_no_queue)) == [], "held without waits above the switch interval is not contention"
    broken = [(0, _sample(10, *HOT)), (0, _sample(11, *HOT)), (0, _sample(12, *COOL)), (0, _sample(13, *HOT))]
    assert d(_batch(*broken)) == []
    assert (
        d(
            _batch(
                (
                    0,
                    _sample(20, *HOT),
                ),
                (1, _sample(20, *HOT)),
            )
        )
        == []
    )  # rank 0 has 2 in a row now
    assert [a.rank for a in d(_batch((0, _sample(21, *HOT)), (1, _sample(21, *HOT))))] == [0]


def test_detector_skips_free_threaded_builds() -> None:
    d = GilContention(GilContentionSettings())
    assert d(_batch(*[(0, _sample(i, *HOT, enabled=False)) for i in range(5)])) == []


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


def test_probe_backs_off_while_the_gil_is_saturated_and_recovers_after() -> None:
    """A GIL-bound thread makes the probe sleep longer (cheaper); once it stops, the probe speeds up again."""
    from support import wait_for

    from trainvigil.agents.gil.sampler import SATURATED_SLEEP, GilSampler

    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    sampler = GilSampler(1.0).start()
    fast = sampler.mean_sleep
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        wait_for(lambda: sampler._probe.mean_sleep == SATURATED_SLEEP, 20, "the probe to back off")
    finally:
        stop.set()
        spinner.join()
    wait_for(lambda: sampler._probe.mean_sleep == fast, 20, "the probe to speed up again")
    sampler.stop()
