"""The sampler thread: probe continuously, attribute at most 20 times a second, report per period."""

from __future__ import annotations

import atexit
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable

from ._probe import BUSY_WAIT, MEAN_SLEEP, Probe, summarize
from ._threads import SUPPORTED, Attribution
from .result import GilResult, build_result

log = logging.getLogger("trainvigil.gil")

MAX_ATTRIBUTION_HZ = 20.0

SATURATED_SHARE = 0.8
"""The GIL is *saturated* when at least this share of the last ``ADAPT_EVERY`` probes found it held."""

SATURATED_SLEEP = 20e-3
"""Mean probe sleep while saturated. Each probe then costs the holder a forced switch, and
the numbers that matter (held close to 1, waits of a switch interval or more) need far fewer
samples, so the probe backs off 4x until contention drops."""

SATURATED_ATTRIBUTION_HZ = 2.5

ADAPT_EVERY = 16
"""Probes between two looks at whether the GIL is saturated (about 0.1 s at the fast rate)."""


def gil_enabled() -> bool:
    """False on a free-threaded build running without the GIL (3.13t and later)."""
    check = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else bool(check())


class GilSampler:
    """Measures GIL contention on a background thread.

    Args:
        interval: seconds per period; every period ends in ``on_period(result)``. ``math.inf``
            makes one period that ends at :meth:`stop` (what ``detect_gil_contention`` does).
        on_period: called on the sampler thread with each :class:`GilResult`; must not block.
        attribution_hz: attribution ticks per second (at most 20; 0 turns attribution off).
        mean_sleep: mean of the probe's exponential sleeps. While the GIL is saturated (see
            ``SATURATED_SHARE``) the probe sleeps ``SATURATED_SLEEP`` on average and attribution
            runs at most ``SATURATED_ATTRIBUTION_HZ``.
        name: the name results carry.
    """

    def __init__(
        self,
        interval: float = 1.0,
        on_period: Callable[[GilResult], None] | None = None,
        *,
        attribution_hz: float = 10.0,
        mean_sleep: float = MEAN_SLEEP,
        name: str = "gil",
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.interval = interval
        self.on_period = on_period
        self.attribution_hz = min(max(attribution_hz, 0.0), MAX_ATTRIBUTION_HZ)
        self.name = name
        self.mean_sleep = mean_sleep
        self._probe = Probe(mean_sleep)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._last: GilResult | None = None
        self._gil_enabled = gil_enabled()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._pid == os.getpid()

    def start(self) -> GilSampler:
        """Start the sampler thread (once). Returns ``self``."""
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name="trainvigil-gil", daemon=True)
        self._thread.start()
        atexit.register(_stop_at_exit, weakref.ref(self))
        return self

    def stop(self, timeout: float = 2.0) -> GilResult | None:
        """Stop and return the last (partial) period's result; None if nothing was measured.

        In a forked child the parent's sampler thread does not exist: this only marks it stopped.
        """
        self._stop.set()
        thread = self._thread
        if thread is not None and self._pid == os.getpid() and thread is not threading.current_thread():
            thread.join(timeout)
        return self._last

    def _run(self) -> None:
        probe = self._probe
        probe.open()
        attribution: Attribution | None = None
        note = ""
        if not self._gil_enabled:
            note = "free-threaded build with the GIL disabled: there is no GIL to contend for; attribution skipped"
        elif not SUPPORTED:
            note = f"attribution needs Linux ({sys.platform}): probe only"
        elif self.attribution_hz > 0:
            attribution = Attribution(exclude={threading.get_native_id()})
        if not probe.corrects_run_queue and self._gil_enabled:
            note = (note + "; " if note else "") + "no schedstat: waits include CPU run-queue delay"
        tick = 1.0 / self.attribution_hz if attribution is not None else math.inf
        waits: list[float] = []
        started_wall = time.time()
        started = next_tick = time.perf_counter()
        try:
            if attribution is not None:
                attribution.tick()  # primes the CPU clocks
            while not self._stop.is_set():
                waits.append(probe.once())
                now = time.perf_counter()
                if now >= next_tick and attribution is not None:
                    attribution.tick(contended=waits[-1] > BUSY_WAIT)
                    probe.rebase()
                    next_tick = max(next_tick + tick, now)
                if len(waits) % ADAPT_EVERY == 0:
                    recent = waits[-ADAPT_EVERY:]
                    saturated = sum(w > BUSY_WAIT for w in recent) >= SATURATED_SHARE * len(recent)
                    probe.mean_sleep = max(self.mean_sleep, SATURATED_SLEEP) if saturated else self.mean_sleep
                    if attribution is not None:
                        hz = min(self.attribution_hz, SATURATED_ATTRIBUTION_HZ) if saturated else self.attribution_hz
                        tick = 1.0 / hz
                if now - started >= self.interval:
                    self._emit(waits, now - started, started_wall, attribution, note)
                    waits = []
                    started, started_wall = now, time.time()
            self._emit(waits, time.perf_counter() - started, started_wall, attribution, note)
        except Exception:  # a sampler bug must never reach the training process
            log.exception("trainvigil: the GIL sampler stopped")
        finally:
            probe.close()
            if attribution is not None:
                attribution.close()

    def _emit(
        self, waits: list[float], elapsed: float, started: float, attribution: Attribution | None, note: str
    ) -> GilResult:
        result = build_result(
            self.name,
            started,
            summarize(waits, elapsed),
            attribution.drain() if attribution is not None else None,
            sys.getswitchinterval(),
            self._gil_enabled,
            note,
        )
        self._last = result
        if self.on_period is not None and result.samples:
            try:
                self.on_period(result)
            except Exception:
                log.exception("trainvigil: a GIL period callback failed")
        return result


def _stop_at_exit(ref: weakref.ref[GilSampler]) -> None:
    sampler = ref()
    if sampler is not None:
        sampler.stop(timeout=1.0)
