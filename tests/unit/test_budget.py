"""The web view's share of the event loop (``daemon/web/budget.py``) while the ingest is busy, and when it is not."""

from __future__ import annotations

import time

import anyio
import pytest


def _burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def _budget_run(busy: bool, requests: int, cost_s: float, share: float) -> tuple[float, int]:
    """Wall time for ``requests`` sequential requests of ``cost_s`` CPU each through an :class:`HttpBudget`."""
    from trainvigil.daemon.web.budget import HttpBudget

    async def app(scope: object, receive: object, send: object) -> None:
        _burn(cost_s)

    budget = HttpBudget(app, busy=lambda: busy, share=share, burst_s=0.0)

    async def scenario() -> float:
        started = time.monotonic()
        for _ in range(requests):
            await budget({"type": "http", "path": "/api/runs"}, None, None)  # type: ignore[arg-type]
        await budget({"type": "http", "path": "/healthz"}, None, None)  # type: ignore[arg-type]
        return time.monotonic() - started

    return anyio.run(scenario, backend="asyncio"), budget.held


@pytest.mark.serial
def test_while_the_ingest_is_busy_requests_use_at_most_their_share_of_the_loop() -> None:
    took, held = _budget_run(busy=True, requests=10, cost_s=0.005, share=0.25)
    # Each request costs at least 5 ms; before the 10th may start, the budget (which starts empty) must
    # have refilled what the first 9 cost at a quarter of a core: 180 ms, however busy the machine is.
    assert took >= 0.99 * 9 * 0.005 / 0.25 and held > 0


@pytest.mark.serial
def test_while_the_ingest_is_idle_requests_are_never_held() -> None:
    took, held = _budget_run(busy=False, requests=10, cost_s=0.005, share=0.25)
    assert held == 0 and took < 1.0
