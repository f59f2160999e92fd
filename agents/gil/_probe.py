"""The contention probe: how long a thread that wants the GIL has to wait for it.

Asking "who holds the GIL" from another thread does not work (``PyGILState_Check``
answers only for the calling thread) and neither does watching frames for movement.
So the probe measures waiting: it sleeps an exponentially distributed interval and, on
waking, needs the GIL to return from its sleep. Its lateness is what the kernel took to run
it again (timer slack, run-queue delay, and on a virtual machine an idle vCPU's slow wake-up)
plus the GIL wait. The probe subtracts the first part:

- On Linux it sleeps in a ``read`` of a periodic ``timerfd`` (:class:`WakeTimer`), with the GIL
  released. The kernel counts the timer's periods until the read completes, on the probe's
  thread and before that thread asks for the GIL: that count is the kernel's lateness, to
  within one period (20 µs).
- Elsewhere, or without ``timerfd``, it sleeps in ``time.sleep`` and subtracts its run-queue
  delay, read from ``/proc/thread-self/schedstat`` (:class:`RunQueueClock`) where there is one.
  A virtual machine's slow vCPU wake-ups are not in it: with nothing holding the GIL, ten idle
  runs on this project's VM measured held 0.010-0.063 so, and five through the timer 0.001-0.008.

Neither the schedstat read nor the timer's setup may release the GIL (that would add a second
GIL wait inside the measurement), so both call libc through :class:`ctypes.PyDLL`, which keeps
the GIL held across the call; only the timer's blocking ``read`` goes through
:class:`ctypes.CDLL`, which releases it.
"""

from __future__ import annotations

import ctypes
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

TIMER_SLACK = 1e-4
"""Seconds of wake-up lateness that is not waiting: the kernel's timer slack and wake-up path."""

BUSY_WAIT = 5e-4
"""A probe that waited longer than this found the GIL held by someone else."""

MEAN_SLEEP = 5e-3
"""Mean of the probe's exponential sleeps: about 100-200 probes a second."""

_SCHEDSTAT = "/proc/thread-self/schedstat"


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_CLOCK_MONOTONIC = 1
_TFD_CLOEXEC = 0o2000000


class WakeTimer:
    """Sleeps on a periodic ``timerfd`` and says how late the kernel ran the thread again (Linux).

    Armed for ``seconds`` and then every :attr:`period`, the timer's ``read`` returns how many periods
    elapsed; the kernel counts them when the read completes, before the thread takes the GIL back, so
    ``(count - 1) * period`` is the lateness that is not a GIL wait (rounded down to a period). Setting
    the timer again resets the count (a tick after the read is forgotten then). Create it on the thread
    that sleeps on it; ``available`` is False where ``timerfd`` is missing, and :meth:`sleep` must not be
    called then.
    """

    period = 20e-6

    def __init__(self) -> None:
        self._fd = -1
        if not sys.platform.startswith("linux"):
            return
        try:
            held = ctypes.PyDLL(None, use_errno=True)  # keeps the GIL across the call
            free = ctypes.CDLL(None, use_errno=True)  # releases it while the read blocks
            create, settime, read = held.timerfd_create, held.timerfd_settime, free.read
        except (OSError, AttributeError):
            return
        settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        read.restype = ctypes.c_ssize_t
        self._settime, self._read = settime, read
        self._arm, self._count = _Itimerspec(), ctypes.c_uint64()
        self._arm.it_interval.tv_nsec = round(self.period * 1e9)
        self._fd = create(_CLOCK_MONOTONIC, _TFD_CLOEXEC)

    @property
    def available(self) -> bool:
        return self._fd >= 0

    def sleep(self, seconds: float) -> float:
        """Sleep ``seconds`` (GIL released); the kernel's lateness in waking the thread, in seconds
        (a multiple of :attr:`period`), or ``-1.0`` when the timer failed (the sleep may have been short)."""
        whole, frac = divmod(seconds, 1.0)
        value = self._arm.it_value
        value.tv_sec, value.tv_nsec = int(whole), max(1, int(frac * 1e9))  # 0 would disarm it
        if self._settime(self._fd, 0, ctypes.byref(self._arm), None) != 0:
            return -1.0
        # Left armed: it ticks once more a period later, and the next sleep's setting clears that count.
        done = self._read(self._fd, ctypes.byref(self._count), 8)
        return (self._count.value - 1) * self.period if done == 8 else -1.0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RunQueueClock:
    """The calling thread's total run-queue delay in seconds (Linux ``schedstat`` field 2).

    Create it on the thread it measures: ``/proc/thread-self`` resolves when opened.
    ``available`` is False elsewhere (non-Linux, no schedstats); ``read()`` then returns 0.
    """

    def __init__(self) -> None:
        self._fd = -1
        self._buf = ctypes.create_string_buffer(128)
        if not sys.platform.startswith("linux"):
            return
        try:
            fd = os.open(_SCHEDSTAT, os.O_RDONLY)
        except OSError:
            return
        libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL (CDLL would release it)
        pread = libc.pread
        pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
        pread.restype = ctypes.c_ssize_t
        self._pread = pread
        self._fd = fd
        if self.read() < 0:
            self.close()

    @property
    def available(self) -> bool:
        return self._fd >= 0

    def read(self) -> float:
        if self._fd < 0:
            return 0.0
        n = self._pread(self._fd, self._buf, 127, 0)
        if n <= 0:
            return -1.0
        fields = self._buf.raw[:n].split()
        return int(fields[1]) / 1e9 if len(fields) > 1 else -1.0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Probe:
    """One probe thread's measurements. Call :meth:`open` on that thread, then :meth:`once`.

    A ``schedstat`` read costs tens of microseconds right after a wake-up on some virtual
    machines (and the GIL is held meanwhile), so each probe reads it once, after waking, and
    the previous probe's reading stands for "before". Whoever does GIL-holding work between
    probes (the attribution tick) calls :meth:`rebase`, so its own run-queue delay is not
    taken from the next probe's wait.
    """

    def __init__(self, mean_sleep: float = MEAN_SLEEP, seed: int | None = None) -> None:
        self.mean_sleep = mean_sleep
        self._rng = random.Random(seed)
        self._timer: WakeTimer | None = None
        self._clock: RunQueueClock | None = None
        self._queued = 0.0

    def open(self) -> None:
        timer = WakeTimer()
        if timer.available:
            self._timer = timer
        self._clock = RunQueueClock()
        self.rebase()

    @property
    def corrects_run_queue(self) -> bool:
        """The kernel's part of a late wake-up is taken out (by the timer, or at least the run-queue delay)."""
        return self._timer is not None or (self._clock is not None and self._clock.available)

    def rebase(self) -> None:
        """Take a fresh run-queue reading as the next probe's starting point."""
        assert self._clock is not None, "call open() on the probe thread first"
        if self._timer is None:  # the timer measures each sleep from its own deadline
            self._queued = self._clock.read()

    def once(self) -> float:
        """Sleep one exponential interval; return the GIL wait on waking (seconds, >= 0)."""
        clock = self._clock
        assert clock is not None, "call open() on the probe thread first"
        # Capped so that stop() never waits on one very long sleep.
        d = min(self._rng.expovariate(1.0 / self.mean_sleep), 10 * self.mean_sleep)
        t0 = time.perf_counter()
        if self._timer is not None:
            kernel = self._timer.sleep(d)
            late = time.perf_counter() - t0 - d
            if kernel >= 0:  # its count is rounded down: one period more is the kernel's too
                return max(0.0, late - kernel - WakeTimer.period - TIMER_SLACK)
            self._timer.close()  # failed once: the run-queue clock from now on
            self._timer = None
            self.rebase()
            return 0.0  # this sleep's lateness is unknown
        time.sleep(d)
        late = time.perf_counter() - t0 - d
        queued, before = clock.read(), self._queued
        self._queued = queued
        return max(0.0, late - max(queued - before, 0.0) - TIMER_SLACK)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.close()
        if self._clock is not None:
            self._clock.close()


@dataclass(frozen=True, slots=True)
class WaitSummary:
    """One period's waits: percentiles in seconds and the shares they imply.

    ``busy_share`` (B) is the share of probes that found the GIL held; ``wait_share`` (W)
    the fraction of the period the probe spent waiting. W alone saturates (a probe that
    waits a switch interval after each sleep cannot wait more than half the time), so the
    hold estimate is ``held = W + B (1 - W)``.
    """

    samples: int
    elapsed: float
    wait_p50: float
    wait_p90: float
    wait_p99: float
    wait_max: float
    busy_share: float
    wait_share: float
    held: float


def _rank(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 when empty)."""
    if not ordered:
        return 0.0
    i = min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))
    return ordered[i]


def summarize(waits: Sequence[float], elapsed: float) -> WaitSummary:
    """Percentiles and shares of one period's probe waits over ``elapsed`` seconds."""
    ordered = sorted(waits)
    n = len(ordered)
    busy = sum(1 for w in ordered if w > BUSY_WAIT) / n if n else 0.0
    wait = min(1.0, sum(ordered) / elapsed) if elapsed > 0 else 0.0
    return WaitSummary(
        samples=n,
        elapsed=elapsed,
        wait_p50=_rank(ordered, 0.50),
        wait_p90=_rank(ordered, 0.90),
        wait_p99=_rank(ordered, 0.99),
        wait_max=ordered[-1] if n else 0.0,
        busy_share=busy,
        wait_share=wait,
        held=min(1.0, wait + busy * (1.0 - wait)),
    )
