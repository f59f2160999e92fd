"""The public GIL API (``trainvigil/gil.py``): ``detect_gil_contention`` and ``@profile_gil`` on real threads."""

from __future__ import annotations

import io
import threading

import pytest

from trainvigil.gil import detect_gil_contention, profile_gil


@pytest.mark.serial
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
