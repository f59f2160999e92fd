"""Ingest: fetch → order → decode → detectors → store (one transaction) → ack.

Two tasks joined by a bounded memory stream: the fetcher decodes the next batch while the
writer commits the previous one (DuckDB releases the GIL). The stream holds at most one
batch of at most ``fetch_max_bytes``; when the writer is slower the fetcher waits, and
JetStream keeps the rest. So at most three batches are in memory at once (being fetched,
waiting, being committed): with DuckDB's ``store.memory_limit_bytes`` that is the daemon's
memory budget under any flood (docs/operations/deploy.md, "Disk and memory").

The fetcher hands the writer stream sequences in order and without holes, or with the holes
recorded as losses (see :mod:`.sequencer` for the rule and why the committed offset is then
exact). When delivery skips ahead it asks the stream what is missing and either records the
loss or recreates the consumer at the sequence it needs (a *rewind*); when the consumer owes
messages that never come, it says so (``/healthz``, the log) and rewinds.
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
from nats.js.errors import NotFoundError

from trainvigil.daemon import detectors
from trainvigil.daemon.alerts.fanout import Alerts
from trainvigil.daemon.batch.decode import DeadLetter, IngestBatch, RawMessage, SeqGap, decode_batch
from trainvigil.daemon.broker.jetstream import Puller, bind_consumer, restore_stream, stream_view
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.ingest._forgery import ForgeryPages
from trainvigil.daemon.ingest.isolate import write_isolating
from trainvigil.daemon.ingest.sequencer import RECREATED, Sequencer, StreamView, Verdict, judge, recreated
from trainvigil.daemon.malloc import trim
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.daemon.store.writer import Store
from trainvigil.errors import StoreUnavailableError
from trainvigil.schemas import Anomaly
from trainvigil.schemas.kinds import RECORD_KINDS

log = structlog.get_logger("trainvigil.ingest")

STUCK_ROUNDS = 3
"""Empty fetches in a row, while the consumer says it owes messages, before the ingest counts as stuck."""

TRIM_EVERY_S = 5.0
"""The heap is trimmed (``malloc.trim``) at most this often, when the ingest catches up after work."""

PURGE_INTERVAL_S = 0.5
"""Committed messages are purged from the stream at most this often."""

_BROKER_ERRORS = (nats.errors.Error, TimeoutError)  # nats-py raises both its own and asyncio's timeouts


@dataclass
class Fetched:
    batch: IngestBatch
    msgs: Sequence[Msg]
    lag: int


def _stream_seq(msg: Msg) -> int:
    return int(msg.metadata.sequence.stream)


def _count(metrics: DaemonMetrics, batch: IngestBatch) -> None:
    metrics.events_ingested["steps"] += batch.step_rows
    for kind in RECORD_KINDS.values():
        if kind.sourced and kind.field != "steps" and (items := getattr(batch, kind.field)):
            metrics.events_ingested[kind.counter] += len(items)
    for letter in batch.dead_letters:
        metrics.dead_letters[letter.reason] += 1
    for forgery in batch.forged:
        metrics.forged_records.update(forgery.kinds)
    for gap in batch.losses:
        metrics.data_loss[gap.reason] += gap.count


def _free_bytes(store: Store) -> int | None:
    try:
        return store.free_bytes()
    except OSError:
        return None


def _daemon_page(detector: str, message: str, value: float | None = None) -> Anomaly:
    """A page about the daemon itself (not a run): it goes out like any alert."""
    return Anomaly(
        time=time.time(),
        run_id="_daemon",
        rank=0,
        step=None,
        detector=detector,
        severity="page",
        value=value,
        message=message,
    )


def _loss_alert(gap: SeqGap, stream: str) -> Anomaly:
    return _daemon_page(
        "data_loss",
        f"{gap.count} messages of stream {stream} (sequences {gap.first}..{gap.last}) will never be stored:"
        f" {gap.reason}; runs live at that time may miss steps (see the data_loss table)",
        float(gap.count),
    )


def _store_alert(exc: StoreUnavailableError) -> Anomaly:
    """A page named for what stops the store (``disk_full``, ``out_of_memory``, ``io_error``)."""
    return _daemon_page(
        exc.cause, f"the daemon cannot store history and has paused ingest (nothing is lost yet): {exc}"
    )


class StreamRecreatedError(Exception):
    """Internal: the stream is not the one the committed offset belongs to."""


class Ingest:
    """The ingest stage of one daemon."""

    def __init__(
        self, js: JetStreamContext, store: Store, config: DaemonConfig, metrics: DaemonMetrics, alerts: Alerts
    ) -> None:
        self.js, self.store, self.config, self.metrics, self.alerts = js, store, config, metrics, alerts
        self.detectors = detectors.build(config.detectors)
        self.stopping = anyio.Event()
        self._puller: Puller | None = None
        self._stream_created: object = None
        self._stream_last = 0
        self._next_purge = 0.0
        self._purged_below = 0
        metrics.detector_errors = self.detectors.failures.errors  # mutated in place by the detectors
        metrics.detector_disabled = self.detectors.failures.disabled
        metrics.runs.idle_s = self.detectors.runs.silent_forget_s  # a run's gauges go with its detectors' state
        self._owed_rounds = 0
        self._trim_when_idle = False
        """Batches were taken since the heap was last trimmed (it is, once the ingest catches up)."""
        self._trimmed_at = -TRIM_EVERY_S
        self._fruitless_rewinds = 0
        self._forgeries = ForgeryPages()

    async def run(self, *, drain: bool = False) -> None:
        """Run until :meth:`stop` (or, with ``drain``, until the stream is consumed)."""
        sequencer = Sequencer(self.store.last_seq + 1)
        send, receive = anyio.create_memory_object_stream[Fetched](1)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write_loop, receive)
                async with send:
                    while True:
                        try:
                            # The fetch loop binds the consumer itself, so a broker that goes away
                            # before the first bind is waited out like any later outage.
                            await self._fetch_loop(sequencer, send, drain)
                            break
                        except StreamRecreatedError as exc:
                            sequencer = await self._follow_new_stream(sequencer, send, str(exc))
        finally:
            with anyio.CancelScope(shield=True):
                await self._unbind()

    def stop(self) -> None:
        self.stopping.set()

    # ---- the fetcher -----------------------------------------------------------------------

    async def _fetch_loop(self, seq: Sequencer, send: MemoryObjectSendStream[Fetched], drain: bool) -> None:
        while not self.stopping.is_set():
            try:
                if self._puller is None:
                    await self._bind(seq)
                assert self._puller is not None
                pulled = await self._puller.pull()
                if pulled.consumer_gone:
                    await self._rewind(seq, "consumer_gone")
                elif pulled.too_big:
                    self._puller.max_bytes *= 2
                    log.warning("fetch_budget_raised", max_bytes=self._puller.max_bytes)
                elif pulled.msgs:
                    await self._take(seq, pulled.msgs, send)
                elif pulled.refused:
                    log.warning("fetch_refused", status=pulled.status, description=pulled.description)
                    await anyio.sleep(0.5)
                elif await self._idle(seq, send, drain):
                    return
            except _BROKER_ERRORS as exc:
                # Broker restarting, reconnecting, stream gone: what was in flight may be lost, so
                # start the consumer again at next_seq once the broker answers.
                log.warning("fetch_failed", error=repr(exc), next_seq=seq.next_seq)
                self.metrics.stuck = f"fetch_failed: cannot fetch from stream {self.config.stream.name}: {exc!r}"
                await self._unbind()
                await anyio.sleep(0.5)

    async def _take(self, seq: Sequencer, msgs: list[Msg], send: MemoryObjectSendStream[Fetched]) -> None:
        """Hand the writer the in-order part of one delivery, with any losses found on the way."""
        seqs = [m.metadata.sequence.stream for m in msgs]
        start = seq.next_seq
        try:
            admission = seq.admit(seqs)
            take, stale = admission.take, admission.stale
            losses: list[SeqGap] = []
            rewind = False
            while admission.gap is not None:
                self.metrics.seq_gaps += 1
                verdict, _ = await self._judge(seq.next_seq, admission.gap)
                losses += verdict.losses
                seq.skip(verdict.losses)
                if verdict.rewind:
                    rewind = True
                    break
                admission = seq.admit(seqs, admission.held)
                take += admission.take
                stale += admission.stale
        except BaseException:
            seq.next_seq = start  # nothing of this delivery reached the writer: it comes again
            raise
        if take or losses:
            if take:
                self._owed_rounds = self._fruitless_rewinds = 0
                self._trim_when_idle = True
                self.metrics.stuck = ""
            raw = [RawMessage(msgs[i].subject, msgs[i].data, seqs[i]) for i in take]
            batch = await anyio.to_thread.run_sync(decode_batch, raw)
            batch.losses = losses
            await self._send(seq, batch, [msgs[i] for i in take], msgs[-1].metadata.num_pending, send)
        self.metrics.messages_skipped += len(stale)
        if stale:  # durability lives in the offset, so a redelivery can be acked at once
            await msgs[max(stale, key=lambda i: seqs[i])].ack()
        if rewind:
            await self._rewind(seq, "gap")

    async def _send(
        self, seq: Sequencer, batch: IngestBatch, msgs: list[Msg], lag: int, send: MemoryObjectSendStream[Fetched]
    ) -> None:
        # Everything below next_seq is in this batch or an earlier one, or recorded lost: the offset.
        batch.max_seq = seq.next_seq - 1
        batch.now = time.time()
        batch.anomalies.extend(await self._detect(batch))
        batch.anomalies.extend(self._forgeries.pages(batch.forged, batch.now))
        batch.cache.clear()  # the detectors' merged views: not needed to store the batch, and as large
        await send.send(Fetched(batch, msgs, lag))

    async def _idle(self, seq: Sequencer, send: MemoryObjectSendStream[Fetched], drain: bool) -> bool:
        """A fetch that brought nothing: check the consumer, tick the detectors. True: drained."""
        try:
            info = await self.js.consumer_info(self.config.stream.name, self.config.stream.consumer)
        except NotFoundError:
            await self._rewind(seq, "consumer_gone")
            return False
        pending = info.num_pending or 0
        delivered = info.delivered.stream_seq if info.delivered else 0
        self.metrics.consumer_lag = pending + (info.num_ack_pending or 0)
        # Owed: the consumer has messages for us, or delivered some we never got (lost in flight,
        # fetched by someone else, skipped because they are gone).
        owed = pending > 0 or delivered >= seq.next_seq
        if not owed:
            self._owed_rounds = 0
            self.metrics.stuck = ""
            if self._trim_when_idle and time.monotonic() >= self._trimmed_at + TRIM_EVERY_S:
                # Caught up after work: what the batches freed goes back to the system.
                self._trim_when_idle, self._trimmed_at = False, time.monotonic()
                await anyio.to_thread.run_sync(trim)
            if drain:
                # The consumer passes over deleted messages at the stream's end without a word:
                # the stream's last sequence says whether any are left to record.
                verdict, view = await self._judge(seq.next_seq, None)
                if view.last_seq < seq.next_seq:
                    log.info("drained", last_seq=seq.next_seq - 1)
                    await self._tick(seq, send)  # the steps held back from the detectors are judged
                    return True
                if verdict.losses:
                    seq.skip(verdict.losses)
                    await self._send(seq, IngestBatch(losses=verdict.losses), [], 0, send)
                    await self._rewind(seq, "tail")
                return False
        else:
            self._owed_rounds += 1
            if self._owed_rounds >= STUCK_ROUNDS << min(self._fruitless_rewinds, 5):
                await self._unstick(seq, send, pending, delivered, info.num_ack_pending or 0)
        # A commit throttled by the purge interval is purged once the stream goes quiet.
        await self._purge_committed()
        await self._tick(seq, send)
        return False

    async def _detect(self, batch: IngestBatch) -> list[Anomaly]:
        """The detectors' alert updates for ``batch``, worked out in a thread: a fleet's batch takes
        them up to a second, and the event loop meanwhile answers ``/healthz``, queries and the broker."""
        return await anyio.to_thread.run_sync(detectors.run_all, self.detectors, batch)

    async def _tick(self, seq: Sequencer, send: MemoryObjectSendStream[Fetched]) -> None:
        """Nothing arrived: time still passes for detectors that watch silence (stall), and the
        steps held back from the per-step detectors while batches were busy are judged."""
        idle = IngestBatch(max_seq=seq.next_seq - 1, now=time.time())
        forgotten = self.detectors.forgotten
        idle.anomalies.extend(await self._detect(idle))
        if self.detectors.forgotten != forgotten:  # idle streams let go: their memory goes back at the next trim
            self._trim_when_idle = True
        if idle.anomalies:
            await send.send(Fetched(idle, [], self.metrics.consumer_lag))

    async def _unstick(
        self, seq: Sequencer, send: MemoryObjectSendStream[Fetched], pending: int, delivered: int, ack_pending: int
    ) -> None:
        reason = (
            f"ingest_stuck: the consumer owes messages from sequence {seq.next_seq} on (num_pending={pending},"
            f" delivered up to {delivered}, num_ack_pending={ack_pending}) but {self._owed_rounds} fetches in a row"
            " brought nothing; recreating the consumer there"
        )
        log.warning(
            "ingest_stuck",
            next_seq=seq.next_seq,
            num_pending=pending,
            delivered_seq=delivered,
            num_ack_pending=ack_pending,
            fetches=self._owed_rounds,
        )
        self.metrics.stuck = reason
        self._owed_rounds = 0
        verdict, _ = await self._judge(seq.next_seq, None)
        if verdict.losses:
            seq.skip(verdict.losses)
            await self._send(seq, IngestBatch(losses=verdict.losses), [], pending, send)
        await self._rewind(seq, "stuck")

    async def _judge(self, next_seq: int, delivered: int | None) -> tuple[Verdict, StreamView]:
        """Ask the stream about the sequences from ``next_seq`` up to ``delivered`` (or its end)."""
        info, existing = await stream_view(self.js, self.config.stream.name, next_seq)
        view = StreamView(first_seq=info.state.first_seq, last_seq=info.state.last_seq, existing=existing)
        self._check_same_stream(next_seq, info.state.last_seq, info.created)
        return judge(next_seq, delivered, view), view

    def _check_same_stream(self, next_seq: int, last_seq: int, created: object) -> None:
        if self._stream_created is None:
            self._stream_created = created
        if created == self._stream_created:
            self._stream_last = max(self._stream_last, last_seq)
        if recreated(next_seq, last_seq) or created != self._stream_created:
            raise StreamRecreatedError(
                f"stream {self.config.stream.name} was recreated: it ends at sequence {last_seq} (created"
                f" {created}), but the daemon has consumed up to {next_seq - 1}"
            )

    # ---- the consumer ------------------------------------------------------------------------

    async def _bind(self, seq: Sequencer) -> None:
        cfg = self.config
        await self._unbind()
        info = await restore_stream(self.js, cfg.stream, cfg.stream_subjects)
        self._check_same_stream(seq.next_seq, info.state.last_seq, info.created)
        await bind_consumer(self.js, cfg.stream, seq.next_seq)
        puller = Puller(
            self.js, cfg.stream, batch=cfg.fetch_batch, max_bytes=cfg.fetch_max_bytes, expires_s=cfg.fetch_timeout_s
        )
        await puller.open()
        self._puller = puller

    async def _unbind(self) -> None:
        if self._puller is not None:
            await self._puller.close()
            self._puller = None

    async def _rewind(self, seq: Sequencer, reason: str) -> None:
        """Recreate the consumer at ``next_seq``; what the old one held back is dropped unacked."""
        self.metrics.rewinds[reason] += 1
        self._fruitless_rewinds += 1
        # A consumer that vanished was deleted by someone else (or with its stream): worth an error.
        say = log.error if reason == "consumer_gone" else log.info
        say("consumer_rewound", reason=reason, next_seq=seq.next_seq, in_a_row=self._fruitless_rewinds)
        await self._unbind()
        if self._fruitless_rewinds > 1:  # no progress since the last one: do not spin on the broker
            await anyio.sleep(min(0.05 * 2**self._fruitless_rewinds, 2.0))
        await self._bind(seq)

    async def _follow_new_stream(self, seq: Sequencer, send: MemoryObjectSendStream[Fetched], reason: str) -> Sequencer:
        """The stream was deleted and created again: record what the old one may still have held
        past the offset as lost, move the offset back to the new stream's start in the same
        transaction, and consume the new stream from its first message."""
        await self._unbind()
        info = await self.js.stream_info(self.config.stream.name)
        start = max(info.state.first_seq or 1, 1)
        old_end = max(seq.next_seq, self._stream_last)
        gap = SeqGap(seq.next_seq, old_end, RECREATED)
        log.error(
            "stream_recreated",
            reason=reason,
            old_from=gap.first,
            old_to=gap.last,
            new_first_seq=start,
            note="messages the old stream held after the offset are unknowable: recorded in data_loss",
        )
        self.metrics.rewinds[RECREATED] += 1
        await send.send(Fetched(IngestBatch(losses=[gap], reset_offset=start - 1, max_seq=start - 1), [], 0))
        self._stream_created = None
        self._stream_last = self._purged_below = 0
        return Sequencer(start)

    # ---- the writer ----------------------------------------------------------------------------

    async def _purge_committed(self) -> None:
        """Drop what is committed from the stream (now and then): DuckDB holds it, and with
        ``discard = "new"`` the stream's limits then only count what the daemon still owes."""
        cfg = self.config.stream
        now = time.monotonic()
        # Anything committed since the last purge is purged, one message too: the stream would otherwise keep
        # two messages (the one kept at the last purge and the one after it) until the next commit.
        if not cfg.purge_committed or now < self._next_purge or self.store.last_seq <= self._purged_below:
            return
        self._next_purge = now + PURGE_INTERVAL_S
        # Keep the last committed message: the stream's first sequence then never passes what the
        # daemon still needs, so a hole after it is judged by what happened to it (deleted,
        # evicted), not by this purge.
        upto = self.store.last_seq
        try:
            await self.js.purge_stream(cfg.name, seq=upto)
            self._purged_below = upto
        except _BROKER_ERRORS as exc:  # the next commit tries again
            log.warning("purge_failed", error=repr(exc), below_seq=upto)

    async def _commit(self, batch: IngestBatch) -> list[DeadLetter]:
        """Write ``batch``, waiting out a store that cannot write (disk full, I/O error).

        Nothing is acked meanwhile, so the stream keeps every message and the fetcher stops at
        the bounded queue: no step is lost and none is stored twice (what a partial commit
        already applied is left out of the retry). A batch the store refuses for what it holds is
        split down to the messages at fault (:func:`.isolate.write_isolating`). Said once in the log,
        on ``/healthz`` and as a page.
        """
        delay = 0.5
        while True:
            try:
                refused = await anyio.to_thread.run_sync(write_isolating, self.store, batch)
            except StoreUnavailableError as exc:
                if not self.metrics.store_unavailable:
                    free = await anyio.to_thread.run_sync(_free_bytes, self.store)
                    log.error(exc.cause, data_dir=str(self.store.path.parent), free_bytes=free, error=str(exc))
                    await self.alerts.publish([_store_alert(exc)])
                self.metrics.store_unavailable = f"{exc.cause}: {exc}"
                self.metrics.store_pauses += 1
                await anyio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            if self.metrics.store_unavailable:
                log.info("store_resumed", data_dir=str(self.store.path.parent), last_seq=self.store.last_seq)
                self.metrics.store_unavailable = ""
            return refused

    async def _write_loop(self, receive: MemoryObjectReceiveStream[Fetched]) -> None:
        async with receive:
            async for fetched in receive:
                batch = fetched.batch
                started = time.perf_counter()
                # Shielded: a commit in progress finishes even while shutting down.
                batch.anomalies.extend(_loss_alert(gap, self.config.stream.name) for gap in batch.losses)
                with anyio.CancelScope(shield=True):
                    refused = await self._commit(batch)
                    if fetched.msgs:  # ack policy "all": the newest acks the batch
                        await max(fetched.msgs, key=_stream_seq).ack()
                m = self.metrics
                for letter in refused:
                    m.dead_letters[letter.reason] += 1
                m.batch_write_seconds.observe(time.perf_counter() - started)
                m.messages_ingested += batch.messages
                m.consumer_lag = fetched.lag
                m.last_seq = self.store.last_seq
                m.last_commit = time.time()
                _count(m, batch)
                m.runs.observe(batch, m.last_commit)
                if batch.dead_letters:
                    for letter in batch.dead_letters:
                        log.warning(
                            "dead_letter",
                            subject=letter.subject,
                            seq=letter.seq,
                            reason=letter.reason,
                            error=letter.error,
                        )
                for gap in batch.losses:
                    log.warning(
                        "data_loss",
                        stream=self.config.stream.name,
                        first=gap.first,
                        last=gap.last,
                        count=gap.count,
                        reason=gap.reason,
                    )
                await self.alerts.publish(batch.anomalies)
                await self._purge_committed()
