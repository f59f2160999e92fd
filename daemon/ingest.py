"""Ingest: fetch → decode → detectors → store (one transaction) → ack, in stream order.

Two tasks joined by a bounded memory stream: the fetcher decodes the next batch while the
writer commits the previous one (DuckDB releases the GIL). The stream holds at most two
batches; when the writer is slower the fetcher waits, and JetStream keeps the rest.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import nats.errors
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from . import detectors
from .alerts import Alerts
from .config import DaemonConfig
from .decode import IngestBatch, RawMessage, decode_batch
from .jetstream import bind_consumer
from .metrics import DaemonMetrics
from .store import Store

log = structlog.get_logger("trainvigil.ingest")


@dataclass
class Fetched:
    batch: IngestBatch
    msgs: Sequence[Msg]
    lag: int


def _count(metrics: DaemonMetrics, batch: IngestBatch) -> None:
    metrics.events_ingested["steps"] += batch.step_rows
    for kind, items in (
        ("run", batch.run_starts + batch.run_ends + batch.events),  # type: ignore[operator]
        ("heartbeat", batch.heartbeats),
        ("gil", batch.gil_samples),
        ("ckpt", batch.checkpoints),
    ):
        if items:
            metrics.events_ingested[kind] += len(items)
    for letter in batch.dead_letters:
        metrics.dead_letters[letter.reason] += 1


class Ingest:
    """The ingest stage of one daemon."""

    def __init__(
        self, js: JetStreamContext, store: Store, config: DaemonConfig, metrics: DaemonMetrics, alerts: Alerts
    ) -> None:
        self.js, self.store, self.config, self.metrics, self.alerts = js, store, config, metrics, alerts
        self.detectors = detectors.build(config)
        self.stopping = anyio.Event()

    async def run(self, *, drain: bool = False) -> None:
        """Run until :meth:`stop` (or, with ``drain``, until the stream is consumed)."""
        sub = await bind_consumer(self.js, self.config.stream, self.store.last_seq)
        send, receive = anyio.create_memory_object_stream[Fetched](2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._write_loop, receive)
            await self._fetch_loop(sub, send, drain)

    def stop(self) -> None:
        self.stopping.set()

    async def _fetch_loop(
        self, sub: JetStreamContext.PullSubscription, send: MemoryObjectSendStream[Fetched], drain: bool
    ) -> None:
        cfg = self.config
        async with send:
            while not self.stopping.is_set():
                try:
                    msgs = await sub.fetch(cfg.fetch_batch, timeout=cfg.fetch_timeout_s)
                except TimeoutError:  # nats-py raises both its own and asyncio's
                    if drain and await self._drained(sub):
                        log.info("drained", last_seq=self.store.last_seq)
                        return
                    self.metrics.consumer_lag = 0
                    # Nothing arrived: time still passes for detectors that watch silence (stall).
                    idle = IngestBatch(max_seq=self.store.last_seq, now=time.time())
                    idle.anomalies.extend(detectors.run_all(self.detectors, idle))
                    if idle.anomalies:
                        await send.send(Fetched(idle, [], 0))
                    continue
                except nats.errors.Error as exc:  # broker restarting, reconnecting: try again
                    log.warning("fetch_failed", error=repr(exc))
                    await anyio.sleep(0.5)
                    continue
                if not msgs:
                    continue
                applied = self.store.last_seq
                raw = [
                    RawMessage(m.subject, m.data, m.metadata.sequence.stream)
                    for m in msgs
                    if m.metadata.sequence.stream > applied
                ]
                self.metrics.messages_skipped += len(msgs) - len(raw)
                batch = decode_batch(raw)
                batch.max_seq = max(batch.max_seq, applied)
                batch.now = time.time()
                batch.anomalies.extend(detectors.run_all(self.detectors, batch))
                await send.send(Fetched(batch, msgs, msgs[-1].metadata.num_pending))

    async def _drained(self, sub: JetStreamContext.PullSubscription) -> bool:
        info = await sub.consumer_info()
        return not info.num_pending and not info.num_ack_pending

    async def _write_loop(self, receive: MemoryObjectReceiveStream[Fetched]) -> None:
        async with receive:
            async for fetched in receive:
                batch = fetched.batch
                started = time.perf_counter()
                # Shielded: a commit in progress finishes even while shutting down.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.store.write, batch)
                    for msg in fetched.msgs:
                        await msg.ack()
                m = self.metrics
                m.batch_write_seconds.observe(time.perf_counter() - started)
                m.messages_ingested += batch.messages
                m.consumer_lag = fetched.lag
                m.last_seq = self.store.last_seq
                m.last_commit = time.time()
                _count(m, batch)
                if batch.dead_letters:
                    for letter in batch.dead_letters:
                        log.warning(
                            "dead_letter",
                            subject=letter.subject,
                            seq=letter.seq,
                            reason=letter.reason,
                            error=letter.error,
                        )
                await self.alerts.publish(batch.anomalies)
