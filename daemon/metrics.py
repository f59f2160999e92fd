"""The daemon's own counters, and a prometheus_client collector over them for ``GET /metrics``."""

from __future__ import annotations

import bisect
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from trainvigil.daemon.batch.decode import IngestBatch

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = _LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(_LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs, counts cumulative, ending with ``+Inf`` (prometheus_client's bucket shape)."""
        pairs, running = [], 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            pairs.append((str(bound), float(running)))
        pairs.append(("+Inf", float(self.n)))
        return pairs


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def _by_label(name: str, help_text: str, label: str, counts: Counter[str], default: str = "") -> CounterMetricFamily:
    """One counter family with one label; with a ``default``, a family never seen still shows it at 0."""
    family = CounterMetricFamily(name, help_text, labels=[label])
    for value in sorted(counts) or ([default] if default else []):
        family.add_metric([value], counts[value])
    return family


RUNS_MAX = 100
"""Runs ``/metrics`` exports training gauges for at most (the most recently active): a fleet of thousands
of runs must not make every scrape thousands of series long."""
RUN_ENDED_S = 600.0
"""An ended run's gauges go this long after its end (a dashboard still shows how it finished), or after
the idle time-out when that is shorter."""
RUN_IDLE_S = 3600.0
"""A run that sent nothing for this long goes too, ended or not (the default of ``[detectors] idle_forget_s``,
which the ingest sets it to: a run's gauges go with its detectors' state)."""
RATE_WINDOW_S = 60.0
"""The step rate is measured over about this much of the run's own (log) time."""


@dataclass(slots=True)
class _RunGauge:
    seen: float
    last_step: int = -1
    loss: float | None = None
    """The latest loss logged (NaN stays NaN: it is the news); ``None`` before any."""
    ended: float = 0.0
    pace: deque[tuple[float, int]] = field(default_factory=deque)
    """(log time, step) of the latest step of each batch, over ``RATE_WINDOW_S``."""
    alerts: dict[tuple[str, int, str], str] = field(default_factory=dict)
    """Open alert episodes: (detector, rank, episode) -> severity."""

    def steps_per_s(self) -> float:
        if len(self.pace) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self.pace[0], self.pace[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


class RunGauges:
    """Per run, for ``/metrics``: the latest step, the step rate, the latest loss and the open alerts by
    severity, for at most ``RUNS_MAX`` runs (the most recently active; ended and idle ones age out)."""

    def __init__(self, most: int = RUNS_MAX, idle_s: float = RUN_IDLE_S) -> None:
        self.most = most
        self.idle_s = idle_s
        """A run silent this long loses its gauges; an ended one after ``min(RUN_ENDED_S, idle_s)``."""
        self._runs: dict[str, _RunGauge] = {}

    def __len__(self) -> int:
        return len(self._runs)

    def _run(self, run_id: str, now: float) -> _RunGauge:
        run = self._runs.pop(run_id, None) or _RunGauge(seen=now)
        run.seen = now
        self._runs[run_id] = run  # most recently active last
        return run

    def observe(self, batch: IngestBatch, now: float) -> None:
        """A committed batch: its steps, run ends and alert updates."""
        for part in batch.steps:
            if not len(part):
                continue
            run = self._run(part.source.run_id, now)
            last = int(part.step.argmax())
            if int(part.step[last]) >= run.last_step:
                run.last_step = int(part.step[last])
                run.pace.append((float(part.times[last]), run.last_step))
                while len(run.pace) > 2 and run.pace[-1][0] - run.pace[1][0] >= RATE_WINDOW_S:
                    run.pace.popleft()
            loss = part.known.get("loss")
            if loss is not None and (loss[1] is None or bool(loss[1][-1])):
                run.loss = float(loss[0][-1])
        for source, _ in batch.run_ends:
            self._run(source.run_id, now).ended = now
        for anomaly in batch.anomalies:
            run = self._run(anomaly.run_id, now)
            key = (anomaly.detector, anomaly.rank, anomaly.episode)
            if anomaly.state == "cleared":
                run.alerts.pop(key, None)
            else:
                run.alerts[key] = anomaly.severity
        self._age(now)

    def _age(self, now: float) -> None:
        idle, ended = self.idle_s, min(RUN_ENDED_S, self.idle_s)
        gone = [
            run_id
            for run_id, run in self._runs.items()
            if (run.ended and now - run.ended > ended) or now - run.seen > idle
        ]
        for run_id in gone:
            del self._runs[run_id]
        while len(self._runs) > self.most:
            del self._runs[next(iter(self._runs))]  # the least recently active

    def collect(self) -> Iterator[Metric]:
        self._age(time.time())
        step = GaugeMetricFamily("vigil_run_last_step", "The latest step a run logged (any rank).", labels=["run_id"])
        rate = GaugeMetricFamily(
            "vigil_run_steps_per_second", "A run's training pace, steps per second of its own clock.", labels=["run_id"]
        )
        loss = GaugeMetricFamily("vigil_run_loss", "The latest loss a run logged.", labels=["run_id"])
        alerts = GaugeMetricFamily(
            "vigil_run_open_alerts", "A run's open alert episodes, by severity.", labels=["run_id", "severity"]
        )
        for run_id, run in self._runs.items():
            step.add_metric([run_id], run.last_step)
            rate.add_metric([run_id], round(run.steps_per_s(), 3))
            if run.loss is not None:  # a run that never logged a loss has no loss series
                loss.add_metric([run_id], run.loss)
            for severity in ("warn", "page"):
                alerts.add_metric([run_id, severity], sum(1 for s in run.alerts.values() if s == severity))
        yield from (step, rate, loss, alerts)
        yield GaugeMetricFamily(
            "vigil_runs_exported",
            f"Runs with gauges here (at most {self.most}: the most recently active).",
            value=len(self._runs),
        )


@dataclass(eq=False)  # hashed by identity: prometheus_client registers it as a collector
class DaemonMetrics:
    """Counters the ingest stage updates; read by ``/metrics`` and ``/healthz``."""

    started: float = field(default_factory=time.time)
    events_ingested: Counter[str] = field(default_factory=Counter)
    messages_ingested: int = 0
    messages_skipped: int = 0
    """Redeliveries: messages delivered again after they were taken, acked and not applied twice."""
    seq_gaps: int = 0
    """Deliveries that skipped over sequences the daemon still needed."""
    rewinds: Counter[str] = field(default_factory=Counter)
    """Consumer re-creations at the next needed sequence, by reason (gap, stuck, tail, consumer_gone)."""
    data_loss: Counter[str] = field(default_factory=Counter)
    """Stream messages recorded lost (``data_loss`` rows), by reason."""
    stuck: str = ""
    """Why the ingest is not making progress ("" while it is); /healthz reports it."""
    store_unavailable: str = ""
    """Why the store cannot write ("" while it can); /healthz reports it, ingest waits."""
    store_pauses: int = 0
    detector_errors: Counter[str] = field(default_factory=Counter)
    """Detector failures by detector (a run taken from it, or a failure no run explains)."""
    detector_disabled: dict[str, set[str]] = field(default_factory=dict)
    """Runs each detector skips after it raised on them, until they end or restart."""
    dead_letters: Counter[str] = field(default_factory=Counter)
    forged_records: Counter[str] = field(default_factory=Counter)
    """Records only the daemon writes (anomaly, canary) refused from agent subjects, by kind."""
    anomalies: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """Alert updates by (detector, severity, state)."""
    webhook: Counter[str] = field(default_factory=Counter)
    """Webhook deliveries by outcome: sent, failed, retried, dropped."""
    webhook_dropped: Counter[str] = field(default_factory=Counter)
    """Webhook updates dropped, by reason: superseded (a newer one of its episode), queue_full, stopped."""
    consumer_lag: int = 0
    last_commit: float = 0.0
    last_seq: int = 0
    batch_write_seconds: Histogram = field(default_factory=Histogram)
    queries: Counter[str] = field(default_factory=Counter)
    replies_refused: Counter[str] = field(default_factory=Counter)
    """Requests not answered because of their reply subject (not an asker's inbox), by responder."""
    web_queries: Counter[str] = field(default_factory=Counter)
    """Queries the web view ran, by endpoint (an answer shared by many requests counts once)."""
    broker_connected: bool = False
    canary_verdicts: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Canary verdicts by (fault kind or ``none``, verdict)."""
    canary_last: dict[str, tuple[float, bool]] = field(default_factory=dict)
    """Per fault kind: when its latest canary was judged (Unix seconds) and whether it passed."""
    canaries_running: int = 0
    runs: RunGauges = field(default_factory=RunGauges)
    """Training gauges per run (``RUNS_MAX`` of them at most)."""

    def canary_judged(self, fault: str, verdict: str, at: float) -> None:
        """Count one verdict; an ``aborted`` canary says nothing about the detectors, so the last-run gauges skip it."""
        self.canary_verdicts[fault, verdict] += 1
        if verdict != "aborted":
            self.canary_last[fault] = (at, verdict == "pass")

    def collect(self) -> Iterator[Metric]:
        """Every counter as prometheus_client metric families (the registry's custom collector)."""
        yield _by_label(
            "vigil_events_ingested_total",
            "Agent events committed to DuckDB, by kind.",
            "kind",
            self.events_ingested,
            "steps",
        )
        yield _counter("vigil_messages_ingested_total", "NATS messages committed.", self.messages_ingested)
        yield _counter(
            "vigil_messages_skipped_total", "Redelivered messages skipped as already applied.", self.messages_skipped
        )
        yield _counter(
            "vigil_seq_gaps_total", "Deliveries that skipped over stream sequences still needed.", self.seq_gaps
        )
        yield GaugeMetricFamily(
            "vigil_ingest_stuck", "Whether the ingest has messages to take and takes none.", value=int(bool(self.stuck))
        )
        yield GaugeMetricFamily(
            "vigil_store_unavailable",
            "Whether the store cannot write (disk full, I/O error) and ingest waits.",
            value=int(bool(self.store_unavailable)),
        )
        yield _counter(
            "vigil_store_pauses_total", "Write attempts refused by the store (disk full, I/O error).", self.store_pauses
        )
        disabled = GaugeMetricFamily(
            "vigil_detector_disabled_runs",
            "Runs a detector skips after raising on them (until they end).",
            labels=["detector"],
        )
        for detector, runs in sorted(self.detector_disabled.items()):
            disabled.add_metric([detector], len(runs))
        yield disabled
        yield _by_label(
            "vigil_detector_errors_total",
            "Detector failures: runs taken from a detector, and failures no run explains.",
            "detector",
            self.detector_errors,
            "non_finite",
        )
        yield _by_label(
            "vigil_consumer_rewinds_total",
            "Consumer re-created at the next needed sequence, by reason.",
            "reason",
            self.rewinds,
            "gap",
        )
        yield _by_label(
            "vigil_data_loss_messages_total",
            "Stream messages that will never be stored (data_loss rows), by reason.",
            "reason",
            self.data_loss,
            "evicted",
        )
        yield _by_label(
            "vigil_dead_letters_total",
            "Messages that could not be read, by reason.",
            "reason",
            self.dead_letters,
            "malformed",
        )
        yield _by_label(
            "vigil_forged_records_total",
            "Records only the daemon writes (alerts, canary verdicts) refused from agents' subjects, by kind.",
            "kind",
            self.forged_records,
            "anomaly",
        )
        anomalies = CounterMetricFamily(
            "vigil_anomalies_total",
            "Alert updates (an episode opens, escalates, clears), by detector.",
            labels=["detector", "severity", "state"],
        )
        for key, n in sorted(self.anomalies.items()):
            anomalies.add_metric(list(key), n)
        yield anomalies
        yield _by_label(
            "vigil_alert_webhook_total",
            "Alert updates for the webhook, by outcome (sent, failed, retried, dropped: the queue was full).",
            "outcome",
            self.webhook,
        )
        yield _by_label(
            "vigil_alert_webhook_dropped_total",
            "Alert updates not posted to the webhook, by reason (superseded: a newer update of its episode went"
            " instead; queue_full; stopped).",
            "reason",
            self.webhook_dropped,
        )
        yield GaugeMetricFamily(
            "vigil_consumer_lag", "Messages in the stream not yet committed.", value=self.consumer_lag
        )
        yield GaugeMetricFamily(
            "vigil_last_commit_timestamp_seconds",
            "When the store last committed a batch (0: never).",
            value=round(self.last_commit, 3),
        )
        yield GaugeMetricFamily("vigil_last_stream_seq", "Highest stream sequence committed.", value=self.last_seq)
        yield GaugeMetricFamily(
            "vigil_broker_connected", "Whether the daemon is connected to NATS.", value=int(self.broker_connected)
        )
        yield _by_label("vigil_queries_total", "SQL queries answered, by outcome.", "outcome", self.queries)
        yield _by_label(
            "vigil_replies_refused_total",
            "Requests not answered: their reply subject is no inbox of a user that may ask, by responder.",
            "responder",
            self.replies_refused,
            "sql",
        )
        yield _by_label(
            "vigil_web_queries_total", "Queries the web view ran, by endpoint.", "endpoint", self.web_queries
        )
        h = self.batch_write_seconds
        yield HistogramMetricFamily(
            "vigil_batch_write_seconds",
            "Time to commit one fetched batch to DuckDB.",
            buckets=h.cumulative(),
            sum_value=h.total,
        )
        yield from self._collect_canaries()
        yield from self.runs.collect()

    def _collect_canaries(self) -> Iterator[Metric]:
        verdicts = CounterMetricFamily(
            "vigil_canary_verdicts_total",
            "Canary verdicts, by fault kind (none: a clean twin) and verdict.",
            labels=["fault", "verdict"],
        )
        for key, n in sorted(self.canary_verdicts.items()):
            verdicts.add_metric(list(key), n)
        yield verdicts
        last = sorted(self.canary_last.items())
        when = GaugeMetricFamily(
            "vigil_canary_last_timestamp_seconds",
            "When the latest canary of a fault kind was judged.",
            labels=["fault"],
        )
        passed = GaugeMetricFamily(
            "vigil_canary_last_passed",
            "Whether the latest canary of a fault kind passed (1) or not (0).",
            labels=["fault"],
        )
        for fault, (at, ok) in last:
            when.add_metric([fault], round(at, 3))
            passed.add_metric([fault], int(ok))
        yield when
        yield passed
        yield GaugeMetricFamily("vigil_canaries_running", "Canary jobs running now.", value=self.canaries_running)

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4) of every counter, written by prometheus_client."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry).decode()
