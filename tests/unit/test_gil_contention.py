"""The gil_contention detector (``daemon/detectors/gil_contention.py``): pages on held GIL plus queued waits."""

from __future__ import annotations

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors.gil_contention import GilContention, GilContentionSettings
from trainvigil.schemas import GilSample, Source, ThreadShare

MS = 1e-3


def _sample(t: float, held: float, p50: float, *, enabled: bool = True) -> GilSample:
    return GilSample(
        time=t,
        period=1.0,
        samples=100,
        wait_p50=p50,
        wait_p90=p50,
        wait_p99=p50,
        wait_max=p50,
        busy_share=held,
        wait_share=held / 2,
        held=held,
        switch_interval=5 * MS,
        gil_enabled=enabled,
        threads=[ThreadShare(name="loader", share=0.9, state="python", top_functions=["parse (data.py:10)"])],
    )


def _batch(*samples: tuple[int, GilSample]) -> IngestBatch:
    return IngestBatch(gil_samples=[(Source(run_id="r", rank=rank), s) for rank, s in samples])


HOT, COOL = (0.95, 8 * MS), (0.2, 0.1 * MS)


def test_detector_pages_after_three_contended_periods_and_names_the_thread() -> None:
    d = GilContention(GilContentionSettings())
    assert d(_batch((0, _sample(1, *HOT)), (0, _sample(2, *HOT)))) == []
    [page] = d(_batch((0, _sample(3, *HOT))))
    assert page.severity == "page" and page.state == "open" and page.step is None
    assert page.value == 0.95 and page.threshold == 0.7
    assert "loader 90%" in page.message and "parse (data.py:10)" in page.message and "num_workers" in page.message
    assert d(_batch((0, _sample(4, *HOT)))) == [], "one episode, not a storm"
    cleared = d(_batch(*[(0, _sample(5 + i, *COOL)) for i in range(3)]))
    assert [a.state for a in cleared] == ["cleared"] and cleared[0].episode == page.episode


def test_detector_needs_both_hold_and_wait_and_consecutive_periods() -> None:
    d = GilContention(GilContentionSettings())
    busy_but_no_queue = [(0, _sample(i, 0.95, 1 * MS)) for i in range(5)]
    assert d(_batch(*busy_but_no_queue)) == [], "held without waits above the switch interval is not contention"
    broken = [(0, _sample(10, *HOT)), (0, _sample(11, *HOT)), (0, _sample(12, *COOL)), (0, _sample(13, *HOT))]
    assert d(_batch(*broken)) == []
    assert (
        d(
            _batch(
                (
                    0,
                    _sample(20, *HOT),
                ),
                (1, _sample(20, *HOT)),
            )
        )
        == []
    )  # rank 0 has 2 in a row now
    assert [a.rank for a in d(_batch((0, _sample(21, *HOT)), (1, _sample(21, *HOT))))] == [0]


def test_detector_skips_free_threaded_builds() -> None:
    d = GilContention(GilContentionSettings())
    assert d(_batch(*[(0, _sample(i, *HOT, enabled=False)) for i in range(5)])) == []
