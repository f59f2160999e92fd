"""Alert fan-out: every update a batch raised goes out once that batch is committed.

Out on four paths: NATS (``vigil.v1.alerts.<run>``, an envelope holding the ``Anomaly``),
the process log (one structlog line), ``/metrics`` (``vigil_anomalies_total`` by detector,
severity and state) and, when ``alerts.webhook_url`` is set, the webhook's queue
(:mod:`.webhook`). The row in DuckDB ``anomalies`` is written by the store in the batch's
own transaction, before any of these.
"""

from __future__ import annotations

import anyio
import nats.errors
import structlog
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS

from trainvigil.daemon.alerts.webhook import WebhookSink
from trainvigil.daemon.config import AlertsConfig
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.schemas import DEFAULT_SUBJECTS, Anomaly, Envelope, Source, Subjects, encode

log = structlog.get_logger("trainvigil.alerts")


class Alerts:
    """The alert stage of one daemon, publishing on ``subjects``' alert subjects."""

    def __init__(
        self, nc: NATS, config: AlertsConfig, metrics: DaemonMetrics, subjects: Subjects = DEFAULT_SUBJECTS
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.metrics = metrics
        self.webhook = WebhookSink(config, metrics) if config.webhook_url else None

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the webhook worker (returns at once when there is no webhook)."""
        if self.webhook is None:
            task_status.started()
            return
        await self.webhook.serve(task_status=task_status)

    async def publish(self, anomalies: list[Anomaly]) -> None:
        """Send committed updates out: NATS, log, counters, webhook queue (which never waits)."""
        for anomaly in anomalies:
            log.warning("anomaly", **{f: getattr(anomaly, f) for f in anomaly.__struct_fields__})
            self.metrics.anomalies[anomaly.detector, anomaly.severity, anomaly.state] += 1
            envelope = Envelope(source=Source(run_id=anomaly.run_id, rank=anomaly.rank), records=[anomaly])
            try:
                await self.nc.publish(self.subjects.alert(anomaly.run_id), encode(envelope))
            except nats.errors.Error as exc:
                log.warning("alert_publish_failed", error=repr(exc), episode=anomaly.episode)
            if self.webhook is not None:
                self.webhook.offer(anomaly)

    async def drain(self) -> None:
        """On shutdown: give queued webhook posts their last ``alerts.drain_s`` seconds."""
        if self.webhook is not None:
            await self.webhook.drain()
