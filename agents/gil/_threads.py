"""Attribution: which threads hold the GIL, which run GIL-free native code, which are blocked.

Each tick (at most 20 a second) runs while the sampler thread holds the GIL: it looks at
every thread's state (after a short GIL-holding pause when it had to wait for the GIL) and
reads every thread's CPU clock. While this thread holds the GIL nobody else runs Python, so
a thread found running (``R``) is in GIL-free native code (a numpy or torch kernel); one
that wants the GIL sleeps on it (``S``). The CPU a thread used since the last tick is split
by that evidence: the native part is free, the rest held the GIL. A thread that used next
to no CPU is blocked (sleep, I/O, a lock).
Hot functions are the top frames of the threads caught holding, weighted by that
GIL-holding CPU.

Everything in a tick keeps the GIL: ``time.clock_gettime`` does not release it and the
thread states from ``/proc/self/task/<tid>/stat`` are read with libc ``pread`` through
:class:`ctypes.PyDLL`. Linux only (:data:`SUPPORTED`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dis
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import FrameType

from .._frames import current_frames

SUPPORTED = sys.platform.startswith("linux") and hasattr(time, "pthread_getcpuclockid")
PAUSE = 2e-4
"""Seconds a tick holds the GIL before looking after a contended acquisition (the previous holder settles)."""

STACK_DEPTH = 3
MIN_FREE_LOOKS = 3
"""Uncontended looks a period needs before they alone estimate a thread's native share."""
IDLE_CPU = 0.05
"""A thread using less CPU than this (seconds per second) counts as blocked."""


def _thread_cpu_clock(tid: int) -> int:
    """The CPU clock of kernel thread ``tid``: the id ``pthread_getcpuclockid`` returns on Linux.

    Built from the native thread id instead of a ``pthread_t``: a thread that exits between
    listing and reading then gives an error (``EINVAL``) rather than a use of freed memory.
    """
    return (~tid << 3) | 6  # CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED


_SWITCH_POINTS = frozenset(dis.opmap[name] for name in ("JUMP_BACKWARD", "RESUME") if name in dis.opmap)


def _at_switch_point(frame: FrameType | None) -> bool:
    """The frame stopped where the eval loop hands the GIL over, not inside a C call.

    A thread that gave up the GIL is runnable (``R``) until it gets a CPU to go back to
    sleep on the GIL; on a busy machine that lasts milliseconds and would look like native
    work. Such a thread stands at a backward jump or a function start, where native code
    never runs.
    """
    if frame is None:
        return False
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] in _SWITCH_POINTS


def _label(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_qualname} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def _folded(frame: FrameType | None, depth: int = STACK_DEPTH) -> str:
    names: list[str] = []
    while frame is not None and len(names) < depth:
        names.append(frame.f_code.co_qualname)
        frame = frame.f_back
    return ";".join(reversed(names))


@dataclass(slots=True)
class ThreadTally:
    """One thread's accumulated evidence over a period.

    ``looks``/``seen_native`` count the pauses that looked at the thread and how many of those
    found it running native code; ``free`` counts only pauses that got the GIL without waiting
    (see :meth:`Attribution.tick`).
    """

    name: str
    tid: int
    cpu: float = 0.0
    wall: float = 0.0
    looks: int = 0
    seen_native: float = 0.0
    free_looks: int = 0
    free_native: float = 0.0
    states: Counter[str] = field(default_factory=Counter)
    functions: dict[str, float] = field(default_factory=dict)
    stacks: dict[str, float] = field(default_factory=dict)

    @property
    def native_rate(self) -> float:
        """The share of wall time the thread ran native code, from the looks that tell best."""
        if self.free_looks >= MIN_FREE_LOOKS:
            return self.free_native / self.free_looks
        return self.seen_native / self.looks if self.looks else 0.0

    @property
    def gil_cpu(self) -> float:
        """CPU seconds spent holding the GIL: what the thread used beyond its native running."""
        return max(0.0, self.cpu - self.native_rate * self.wall)

    def kind(self, wall: float) -> str:
        """``python`` (holds the GIL), ``native`` (GIL-free code) or ``blocked`` (little CPU)."""
        if wall <= 0 or self.cpu / wall < IDLE_CPU:
            return "blocked"
        return "python" if self.gil_cpu >= self.cpu - self.gil_cpu else "native"


class _StatReader:
    """Thread states from ``/proc/self/task/<tid>/stat`` without releasing the GIL."""

    def __init__(self) -> None:
        libc = ctypes.PyDLL(None)
        self._pread = libc.pread
        self._pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
        self._pread.restype = ctypes.c_ssize_t
        self._buf = ctypes.create_string_buffer(512)
        self._fds: dict[int, int] = {}

    def open(self, tids: set[int]) -> None:
        """Open the files of new threads and close those of gone ones (outside the pause)."""
        for tid in set(self._fds) - tids:
            os.close(self._fds.pop(tid))
        for tid in tids - set(self._fds):
            with contextlib.suppress(OSError):  # the thread exited since the listing
                self._fds[tid] = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)

    def look(self) -> dict[int, str]:
        """The state of every thread with an open file: ``R`` running or runnable, ``S`` sleeping..."""
        return {tid: self._state(fd) for tid, fd in self._fds.items()}

    def _state(self, fd: int) -> str:
        n = self._pread(fd, self._buf, 511, 0)
        if n <= 0:
            return "?"
        raw = self._buf.raw[:n]
        end = raw.rfind(b")")  # the command name may hold spaces and parentheses
        return chr(raw[end + 2]) if 0 <= end < n - 2 else "?"

    def close(self) -> None:
        self.open(set())


class Attribution:
    """Per-thread GIL attribution; call :meth:`tick` from the sampler thread, :meth:`drain` per period."""

    def __init__(self, exclude: set[int], pause: float = PAUSE) -> None:
        self.exclude = exclude
        self.pause = pause
        self._stat = _StatReader()
        self._last: dict[int, float] = {}
        self._last_tick = 0.0
        self._tally: dict[int, ThreadTally] = {}

    def tick(self, contended: bool = False) -> None:
        """Look at every thread once. ``contended``: this thread just waited for the GIL.

        The states are read first, while this thread has just taken the GIL: a short native
        call (a 1 ms matmul) that was running then would otherwise end and queue for the GIL
        before the look. After a contended acquisition the thread that handed the GIL over is
        still runnable on its way back to waiting, so the look comes after a short GIL-holding
        pause, and a period prefers its uncontended looks when it has enough of them.
        """
        if contended:
            end = time.perf_counter() + self.pause
            while time.perf_counter() < end:
                pass  # hold the GIL: the previous holder settles into waiting for it
        states = self._stat.look()
        tick, self._last_tick = self._last_tick, time.perf_counter()
        wall = self._last_tick - tick if tick else 0.0
        threads = {t.native_id: t for t in threading.enumerate() if t.native_id and t.native_id not in self.exclude}
        clock_gettime = time.clock_gettime
        now: dict[int, float] = {}
        for tid in threads:
            try:
                now[tid] = clock_gettime(_thread_cpu_clock(tid))
            except OSError:
                continue  # exited since the listing
        frames = current_frames()
        for tid, cpu in now.items():
            thread = threads[tid]
            tally = self._tally.get(tid)
            if tally is None:
                tally = self._tally[tid] = ThreadTally(thread.name, tid)
            last = self._last.get(tid)
            self._last[tid] = cpu
            state = states.get(tid)
            if last is None or state is None:
                continue  # first sight: the CPU clock starts here, the state file opens below
            frame = frames.get(thread.ident) if thread.ident is not None else None
            # With the GIL held here, a running thread runs GIL-free native code, unless it
            # stands where the eval loop hands the GIL over (then it is queued for a CPU).
            native = 1.0 if state == "R" and not _at_switch_point(frame) else 0.0
            used = max(0.0, cpu - last)
            # A thread seen running native code in a share of the looks ran native for that
            # share of the wall time (an estimate that needs no fine-grained CPU clock: on some
            # kernels another thread's clock advances only at scheduler ticks).
            tally.states[state] += 1
            tally.cpu += used
            tally.wall += wall
            tally.looks += 1
            tally.seen_native += native
            if not contended:
                tally.free_looks += 1
                tally.free_native += native
            gil = used * (1.0 - native)
            if gil > 0 and frame is not None:
                label, stack = _label(frame), _folded(frame)
                tally.functions[label] = tally.functions.get(label, 0.0) + gil
                tally.stacks[stack] = tally.stacks.get(stack, 0.0) + gil
        for tid in set(self._last) - set(now):
            del self._last[tid]
        self._stat.open(set(now))  # threads that started since are looked at from the next tick

    def drain(self) -> list[ThreadTally]:
        """This period's tallies (threads seen in it); the clocks carry over to the next period."""
        out = list(self._tally.values())
        self._tally = {}
        return out

    def close(self) -> None:
        self._stat.close()
