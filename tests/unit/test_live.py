"""The commit broadcaster (``daemon/web/live.py``): notices in ticks, and when the ingest counts as busy."""

from __future__ import annotations

import time

import anyio
import pytest

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.web.live import MIN_INTERVAL_S, Broadcaster
from trainvigil.schemas import Anomaly, RunEvent, Source


def test_commits_reach_subscribers_in_ticks_at_most_four_a_second_as_one_notice_naming_every_run() -> None:
    async def scenario() -> tuple[dict[str, object], float]:
        live = Broadcaster()
        live.bind()
        async with live.subscribe() as sub:
            first = IngestBatch(events=[(Source(run_id="a"), RunEvent(time=1.0, kind="eval"))])
            alert = Anomaly(time=1.0, run_id="b", rank=0, step=3, detector="d", severity="page")
            started = time.monotonic()
            await anyio.to_thread.run_sync(live.committed, first)  # the store calls it on its writer thread
            await anyio.to_thread.run_sync(live.committed, IngestBatch(anomalies=[alert]))
            with anyio.fail_after(5):
                while live.generation < 2:  # the first commit ticks at once, the next waits for the interval
                    await anyio.sleep(0.01)
            return sub.take(), time.monotonic() - started

    notice, took = anyio.run(scenario, backend="asyncio")
    assert notice["runs"] == ["a", "b"] and notice["alerts"] is True and notice["events"] is True
    assert took >= MIN_INTERVAL_S


@pytest.mark.serial
def test_the_ingest_counts_as_busy_only_while_committing_a_fleets_worth_of_steps_a_second() -> None:
    import numpy as np

    from trainvigil.daemon.batch.decode import StepColumns
    from trainvigil.daemon.web.live import HEAVY_STEPS_S

    def batch(steps: int) -> IngestBatch:
        ns = np.arange(steps)
        return IngestBatch(steps=[StepColumns(Source(run_id="r"), ns, ns.astype(float), {}, {})])

    async def scenario() -> list[bool]:
        live = Broadcaster()
        live.bind()
        seen = [live.busy()]
        # The writer thread hands its notice to the loop before its own return: both queue in order.
        await anyio.to_thread.run_sync(live.committed, batch(10))
        seen.append(live.busy())
        await anyio.to_thread.run_sync(live.committed, batch(HEAVY_STEPS_S))
        seen.append(live.busy())
        live.close()
        return seen

    assert anyio.run(scenario, backend="asyncio") == [False, False, True]
