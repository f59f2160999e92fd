"""The worker's wake-up alarm (``agents/transport/_alarm.py``): a timed sleep that a ring, from any thread,
ends early."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from trainvigil.agents.transport._alarm import Alarm


@pytest.mark.serial
def test_an_alarm_sleeps_until_its_timeout_when_nobody_rings() -> None:
    async def main() -> float:
        alarm = Alarm()
        started = time.monotonic()
        await alarm.sleep(0.05)
        return time.monotonic() - started

    assert 0.045 <= asyncio.run(main()) < 5


@pytest.mark.serial
def test_a_ring_from_another_thread_ends_the_sleep_early() -> None:
    async def main() -> float:
        alarm, loop = Alarm(), asyncio.get_running_loop()
        threading.Timer(0.05, loop.call_soon_threadsafe, (alarm.ring,)).start()
        started = time.monotonic()
        await alarm.sleep(30)
        return time.monotonic() - started

    assert asyncio.run(main()) < 10, "the ring ended a 30 s sleep"


@pytest.mark.serial
def test_a_ring_before_the_sleep_is_kept_for_it_until_cleared() -> None:
    async def main() -> tuple[float, float]:
        alarm = Alarm()
        alarm.ring()
        started = time.monotonic()
        await alarm.sleep(30)  # at once: it rang before
        kept = time.monotonic() - started
        alarm.clear()
        started = time.monotonic()
        await alarm.sleep(0.05)  # the ring was taken and cleared: a full sleep
        return kept, time.monotonic() - started

    kept, cleared = asyncio.run(main())
    assert kept < 10 and cleared >= 0.045
