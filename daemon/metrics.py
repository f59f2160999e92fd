"""The daemon's own counters, rendered in the Prometheus text format for ``GET /metrics``."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from dataclasses import dataclass, field

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

    def render(self, name: str) -> list[str]:
        lines, cumulative = [], 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            cumulative += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        lines.append(f"{name}_sum {self.total}")
        lines.append(f"{name}_count {self.n}")
        return lines


def _by_label(name: str, help_text: str, label: str, counts: Counter[str], default: str) -> list[str]:
    """One counter family with one label; a family never seen still shows ``default`` at 0."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    lines += [f'{name}{{{label}="{value}"}} {counts[value]}' for value in sorted(counts) or [default]]
    return lines


@dataclass
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
    anomalies: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """Alert updates by (detector, severity, state)."""
    webhook: Counter[str] = field(default_factory=Counter)
    """Webhook deliveries by outcome: sent, failed, retried, dropped."""
    consumer_lag: int = 0
    last_commit: float = 0.0
    last_seq: int = 0
    batch_write_seconds: Histogram = field(default_factory=Histogram)
    queries: Counter[str] = field(default_factory=Counter)
    broker_connected: bool = False
    canary_verdicts: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Canary verdicts by (fault kind or ``none``, verdict)."""
    canary_last: dict[str, tuple[float, bool]] = field(default_factory=dict)
    """Per fault kind: when its latest canary was judged (Unix seconds) and whether it passed."""
    canaries_running: int = 0

    def canary_judged(self, fault: str, verdict: str, at: float) -> None:
        """Count one verdict; an ``aborted`` canary says nothing about the detectors, so the last-run gauges skip it."""
        self.canary_verdicts[fault, verdict] += 1
        if verdict != "aborted":
            self.canary_last[fault] = (at, verdict == "pass")

    def _render_canaries(self) -> list[str]:
        last = sorted(self.canary_last.items())
        return [
            "# HELP vigil_canary_verdicts_total Canary verdicts, by fault kind (none: a clean twin) and verdict.",
            "# TYPE vigil_canary_verdicts_total counter",
            *[
                f'vigil_canary_verdicts_total{{fault="{f}",verdict="{v}"}} {n}'
                for (f, v), n in sorted(self.canary_verdicts.items())
            ],
            "# HELP vigil_canary_last_timestamp_seconds When the latest canary of a fault kind was judged.",
            "# TYPE vigil_canary_last_timestamp_seconds gauge",
            *[f'vigil_canary_last_timestamp_seconds{{fault="{f}"}} {t:.3f}' for f, (t, _) in last],
            "# HELP vigil_canary_last_passed Whether the latest canary of a fault kind passed (1) or not (0).",
            "# TYPE vigil_canary_last_passed gauge",
            *[f'vigil_canary_last_passed{{fault="{f}"}} {int(ok)}' for f, (_, ok) in last],
            "# HELP vigil_canaries_running Canary jobs running now.",
            "# TYPE vigil_canaries_running gauge",
            f"vigil_canaries_running {self.canaries_running}",
        ]

    def render(self) -> str:
        """The Prometheus text exposition of every counter."""
        out = _by_label(
            "vigil_events_ingested_total",
            "Agent events committed to DuckDB, by kind.",
            "kind",
            self.events_ingested,
            "steps",
        )
        out += [
            "# HELP vigil_messages_ingested_total NATS messages committed.",
            "# TYPE vigil_messages_ingested_total counter",
            f"vigil_messages_ingested_total {self.messages_ingested}",
            "# HELP vigil_messages_skipped_total Redelivered messages skipped as already applied.",
            "# TYPE vigil_messages_skipped_total counter",
            f"vigil_messages_skipped_total {self.messages_skipped}",
            "# HELP vigil_seq_gaps_total Deliveries that skipped over stream sequences still needed.",
            "# TYPE vigil_seq_gaps_total counter",
            f"vigil_seq_gaps_total {self.seq_gaps}",
            "# HELP vigil_ingest_stuck Whether the ingest has messages to take and takes none.",
            "# TYPE vigil_ingest_stuck gauge",
            f"vigil_ingest_stuck {int(bool(self.stuck))}",
            "# HELP vigil_store_unavailable Whether the store cannot write (disk full, I/O error) and ingest waits.",
            "# TYPE vigil_store_unavailable gauge",
            f"vigil_store_unavailable {int(bool(self.store_unavailable))}",
            "# HELP vigil_store_pauses_total Write attempts refused by the store (disk full, I/O error).",
            "# TYPE vigil_store_pauses_total counter",
            f"vigil_store_pauses_total {self.store_pauses}",
            "# HELP vigil_detector_disabled_runs Runs a detector skips after raising on them (until they end).",
            "# TYPE vigil_detector_disabled_runs gauge",
            *[
                f'vigil_detector_disabled_runs{{detector="{d}"}} {len(r)}'
                for d, r in sorted(self.detector_disabled.items())
            ],
        ]
        out += _by_label(
            "vigil_detector_errors_total",
            "Detector failures: runs taken from a detector, and failures no run explains.",
            "detector",
            self.detector_errors,
            "non_finite",
        )
        out += _by_label(
            "vigil_consumer_rewinds_total",
            "Consumer re-created at the next needed sequence, by reason.",
            "reason",
            self.rewinds,
            "gap",
        )
        out += _by_label(
            "vigil_data_loss_messages_total",
            "Stream messages that will never be stored (data_loss rows), by reason.",
            "reason",
            self.data_loss,
            "evicted",
        )
        out += _by_label(
            "vigil_dead_letters_total",
            "Messages that could not be read, by reason.",
            "reason",
            self.dead_letters,
            "malformed",
        )
        out += [
            "# HELP vigil_anomalies_total Alert updates (an episode opens, escalates, clears), by detector.",
            "# TYPE vigil_anomalies_total counter",
        ]
        out += [
            f'vigil_anomalies_total{{detector="{d}",severity="{sev}",state="{st}"}} {n}'
            for (d, sev, st), n in sorted(self.anomalies.items())
        ]
        out += [
            "# HELP vigil_alert_webhook_total Alert updates for the webhook, by outcome (sent, failed, retried,"
            " dropped: the queue was full).",
            "# TYPE vigil_alert_webhook_total counter",
        ]
        out += [f'vigil_alert_webhook_total{{outcome="{o}"}} {n}' for o, n in sorted(self.webhook.items())]
        out += [
            "# HELP vigil_consumer_lag Messages in the stream not yet committed.",
            "# TYPE vigil_consumer_lag gauge",
            f"vigil_consumer_lag {self.consumer_lag}",
            "# HELP vigil_last_commit_timestamp_seconds When the store last committed a batch (0: never).",
            "# TYPE vigil_last_commit_timestamp_seconds gauge",
            f"vigil_last_commit_timestamp_seconds {self.last_commit:.3f}",
            "# HELP vigil_last_stream_seq Highest stream sequence committed.",
            "# TYPE vigil_last_stream_seq gauge",
            f"vigil_last_stream_seq {self.last_seq}",
            "# HELP vigil_broker_connected Whether the daemon is connected to NATS.",
            "# TYPE vigil_broker_connected gauge",
            f"vigil_broker_connected {int(self.broker_connected)}",
            "# HELP vigil_queries_total SQL queries answered, by outcome.",
            "# TYPE vigil_queries_total counter",
        ]
        out += [f'vigil_queries_total{{outcome="{o}"}} {n}' for o, n in sorted(self.queries.items())]
        out += [
            "# HELP vigil_batch_write_seconds Time to commit one fetched batch to DuckDB.",
            "# TYPE vigil_batch_write_seconds histogram",
            *self.batch_write_seconds.render("vigil_batch_write_seconds"),
        ]
        out += self._render_canaries()
        return "\n".join(out) + "\n"
