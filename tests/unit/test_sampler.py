"""The GIL sampler (``agents/gil/sampler.py``) on a real GIL-bound thread: the probe backs off, then recovers."""

from __future__ import annotations

import threading

import pytest


@pytest.mark.serial
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
