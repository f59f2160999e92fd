"""Reading other threads' frames never freezes the process (CPython gh-106883 on 3.11).

CI caught a canary frozen mid-step with every thread stopped and a collection in progress;
the GIL sampler and the stuck probe read frames with ``sys._current_frames()``, which on
CPython 3.11 deadlocks when a collection starts inside it and frees a ``threading.local``.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest

from trainvigil.agents import _frames
from trainvigil.agents._stuck import StuckProbe
from trainvigil.agents.gil._threads import SUPPORTED, Attribution

# Garbage that takes the thread-list lock when freed (a threading.local in a cycle), a collection
# due at the next allocation of a tracked object, and a dict on the free list, so that the first
# such allocation is the frame object that sys._current_frames() creates while holding the lock.
REPRODUCTION = textwrap.dedent(
    """
    import gc, sys
    import threading
    from trainvigil.agents._frames import current_frames

    read = {read}
    gc.disable()
    cycle = [threading.local()]
    cycle.append(cycle)
    del cycle
    gc.set_threshold(1)
    spare = {{}}
    del spare
    gc.enable()
    frames = read()
    print("read", len(frames), gc.isenabled(), flush=True)
    gc.collect()
    print("collected", flush=True)
    """
)


def _run(read: str, timeout: float) -> subprocess.CompletedProcess[str]:
    code = REPRODUCTION.format(read=read)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="CPython 3.12 fixed the deadlock itself")
def test_the_reproduction_freezes_bare_sys_current_frames_on_3_11() -> None:
    """The control: without the guard the same script never finishes (what froze the canaries)."""
    with pytest.raises(subprocess.TimeoutExpired):
        _run("sys._current_frames", timeout=5)


def test_current_frames_reads_the_frames_where_a_collection_would_free_a_thread_local() -> None:
    done = _run("current_frames", timeout=30)
    assert done.returncode == 0, done.stderr
    # One frame (the main thread's), the collector enabled again, and a collection after it.
    assert done.stdout.split() == ["read", "1", "True", "collected"], done.stdout


def test_current_frames_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        frames = _frames.current_frames()
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert threading.get_ident() in frames


def test_current_frames_enables_the_collector_again_when_the_read_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> dict[int, object]:
        raise RuntimeError("refused by an audit hook")

    monkeypatch.setattr(sys, "_current_frames", refused)
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="audit hook"):
        _frames.current_frames()
    assert gc.isenabled()


@pytest.mark.skipif(not SUPPORTED, reason="GIL attribution needs Linux")
def test_the_gil_sampler_and_the_stuck_probe_read_frames_with_gc_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both readers of other threads' frames go through the guard (a bare call would record True)."""
    real = sys._current_frames
    enabled_during: list[bool] = []

    def recording() -> dict[int, types.FrameType]:
        enabled_during.append(gc.isenabled())
        return real()

    stop = threading.Event()
    looping = threading.Thread(target=stop.wait, name="stuck-loop")
    looping.start()
    monkeypatch.setattr(sys, "_current_frames", recording)
    try:
        attribution = Attribution(exclude={threading.get_native_id()})
        attribution.tick()
        attribution.tick()
        probe = StuckProbe(looping.ident, after_s=0.0)
        probe.sample(7)
        frames = probe.sample(7)
    finally:
        stop.set()
        looping.join()
        attribution.close()
    assert len(enabled_during) == 3, enabled_during
    assert enabled_during == [False, False, False]
    assert gc.isenabled()
    assert frames and any("wait" in f for f in frames), frames


def test_nothing_else_in_the_package_calls_sys_current_frames() -> None:
    """A new reader of other threads' frames goes through ``current_frames`` too (or it can freeze 3.11)."""
    root = Path(__file__).resolve().parents[2]
    bare = [
        f"{path.relative_to(root)}:{n}"
        for folder in ("agents", "daemon", "schemas", "src")
        for path in sorted((root / folder).rglob("*.py"))
        if path.name != "_frames.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "sys._current_frames(" in line or "sys._current_exceptions(" in line
    ]
    assert bare == [], f"call trainvigil.agents._frames.current_frames() instead: {bare}"
