"""The daemon's Prometheus metrics (``daemon/metrics.py``): every family from the start, valid samples, histograms."""

from __future__ import annotations

import pytest

from trainvigil.daemon.metrics import DaemonMetrics, Histogram


def test_metrics_of_a_fresh_daemon_still_expose_every_family() -> None:
    text = DaemonMetrics().render()
    for name in (
        'vigil_events_ingested_total{kind="steps"} 0',
        'vigil_dead_letters_total{reason="malformed"} 0',
        "vigil_consumer_lag 0",
        "vigil_broker_connected 0",
        'vigil_batch_write_seconds_bucket{le="+Inf"} 0',
        "vigil_batch_write_seconds_count 0",
    ):
        assert name in text


def test_metrics_lines_are_valid_prometheus_samples() -> None:
    metrics = DaemonMetrics(broker_connected=True)
    metrics.anomalies["non_finite", "page", "open"] += 1
    metrics.webhook["sent"] += 1
    metrics.queries["ok"] += 2
    for line in metrics.render().splitlines():
        if line.startswith("#"):
            assert line.split()[1] in {"HELP", "TYPE"}
            continue
        name, value = line.rsplit(" ", 1)
        assert name.startswith("vigil_")
        float(value)


def test_histogram_buckets_are_cumulative_and_count_values_past_the_last_bound() -> None:
    hist = Histogram()
    for value in (0.0005, 0.001, 0.02, 0.02, 20.0):
        hist.observe(value)
    buckets = dict(hist.cumulative())
    assert buckets["0.001"] == 2
    assert buckets["0.025"] == 4
    assert buckets["10.0"] == 4
    assert buckets["+Inf"] == 5
    assert hist.n == 5
    assert hist.total == pytest.approx(20.0415)
