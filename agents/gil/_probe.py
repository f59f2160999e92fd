"""The contention probe: how long a thread that wants the GIL has to wait for it.

Asking "who holds the GIL" from another thread does not work (``PyGILState_Check``
answers only for the calling thread) and neither does watching frames for movement.
So the probe measures waiting: it sleeps an exponentially distributed interval and, on
waking, needs the GIL to return from ``time.sleep``. Its lateness is timer slack, plus
time spent runnable but without a CPU (run-queue delay, read from
``/proc/thread-self/schedstat``), plus the GIL wait. The probe subtracts the first two.

The schedstat read must not release the GIL itself (that would add a second GIL wait
inside the measurement), so it calls libc ``pread`` through :class:`ctypes.PyDLL`,
which keeps the GIL held across the call.
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
        self._clock: RunQueueClock | None = None
        self._queued = 0.0

    def open(self) -> None:
        self._clock = RunQueueClock()
        self.rebase()

    @property
    def corrects_run_queue(self) -> bool:
        return self._clock is not None and self._clock.available

    def rebase(self) -> None:
        """Take a fresh run-queue reading as the next probe's starting point."""
        assert self._clock is not None, "call open() on the probe thread first"
        self._queued = self._clock.read()

    def once(self) -> float:
        """Sleep one exponential interval; return the GIL wait on waking (seconds, >= 0)."""
        clock = self._clock
        assert clock is not None, "call open() on the probe thread first"
        # Capped so that stop() never waits on one very long sleep.
        d = min(self._rng.expovariate(1.0 / self.mean_sleep), 10 * self.mean_sleep)
        t0 = time.perf_counter()
        time.sleep(d)
        late = time.perf_counter() - t0 - d
        queued, before = clock.read(), self._queued
        self._queued = queued
        return max(0.0, late - max(queued - before, 0.0) - TIMER_SLACK)

    def close(self) -> None:
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
