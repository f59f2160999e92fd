"""The GIL report (``agents/gil/_report.py``): bars, waits, hot functions, and advice for each pattern."""

from __future__ import annotations

from gil_results import gil_result as _result

from trainvigil.agents.gil import advice, render

MS = 1e-3


def test_report_shows_bars_waits_hot_functions_and_advice() -> None:
    text = render(_result())
    assert "GIL held ≈ 97%" in text and "p50 5.2 ms" in text and "p99 7.0 ms" in text
    assert "loader" in text and "█" in text and "parse (data.py:10)" in text
    assert "move it to processes" in text and "loader (90%)" in text


def test_advice_per_pattern() -> None:
    assert advice(_result(held=0.02, wait_p50=0.0, wait_p99=0.1 * MS, threads=[])) == []
    long_holds = advice(_result(held=0.4, wait_p50=0.05 * MS, wait_p99=40 * MS, threads=[]))
    assert len(long_holds) == 1 and "release the GIL in the C code" in long_holds[0]
    queue = " ".join(advice(_result(wait_p50=15 * MS)))
    assert "fewer" in queue and "free-threaded" in queue
    assert "free-threaded build" in advice(_result(gil_enabled=False))[0]
