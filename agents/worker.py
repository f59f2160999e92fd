"""The agent's background thread: batches, encodes and publishes, with its own event loop.

The training thread only appends to two deques; this thread drains them on a size or
time trigger, encodes columnar envelopes into an :class:`Outbox` and publishes the
outbox to JetStream in order, ``max_inflight`` messages per round trip. While the broker
is away the outbox grows (memory, then spill file) and is replayed on reconnect; every
message carries a ``Nats-Msg-Id`` so a resend after a lost ack is de-duplicated. The id
holds a random per-process nonce, so no other client can predict it and shadow a message.

Without a broker nothing is lost at exit either: the first failed connect is logged once,
and what is undelivered when ``close()`` ends is sealed into a file in the spill directory.
Once connected, this thread also delivers the sealed files earlier runs left there for the
same broker (:mod:`.push`), beside its own messages.

No value and no failure ends this thread: what cannot be packed, encoded or held is
dropped and counted by reason (the first few are logged by name), an unexpected exception
is logged once per kind, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import nats
from nats.aio.client import Client as NATS

from trainvigil.schemas import (
    CheckpointDigest,
    Envelope,
    GilSample,
    Heartbeat,
    Record,
    RunEnd,
    RunEvent,
    Source,
    StepBatch,
    data_subject,
    encode,
    run_token,
)
from trainvigil.schemas.limits import MAX_NAME
from trainvigil.schemas.subjects import Kind

from ._drops import Drops
from ._values import as_step, describe, wire_text
from .columnar import Entry, StepBatchBuilder, split_step_batch
from .options import AgentOptions, nats_servers
from .outbox import Outbox, OutMsg, SpillError
from .push import SUFFIX, broker_key, leftovers, publish_round, sealed_name, upload

log = logging.getLogger("trainvigil.agent")

_CHUNK = 256  # entries packed per slice of worker time (keeps each GIL hold well under 1 ms)
_MAX_PAYLOAD = 768 * 1024  # below nats-server's default 1 MiB max_payload, with room for headers
_POLL = 0.02  # seconds between checks of the buffers; cheap, and bounds flush latency
_PICKUP_TRIES = 3  # passes over leftover files that failed, before leaving them to the next agent
_KIND_OF: dict[type, Kind] = {
    RunEvent: "run",
    RunEnd: "run",
    Heartbeat: "hb",
    CheckpointDigest: "ckpt",
    GilSample: "gil",
}


class Worker:
    """Owns the broker connection and everything after the two hot-path deques."""

    def __init__(
        self,
        options: AgentOptions,
        source: Source,
        steps: deque[Entry],
        records: deque[Record],
        drops: Drops,
        last_step: Callable[[], Any],
    ) -> None:
        self.options = options
        self.source = source
        self._steps = steps
        self._records = records
        self.drops = drops
        self._last_step = last_step
        self._seq = 0
        # Unpredictable message ids; a worker made after fork draws its own.
        self._nonce = secrets.token_hex(8)
        self._id_prefix = f"{source.run_id}/{source.rank}/{source.host}/{source.pid}/{self._nonce}"
        # The live spill file; what is left at exit goes to a sealed file (push.SUFFIX) beside it.
        self._sealed_name = sealed_name(run_token(source.run_id), source.rank, source.pid, self._nonce)
        self._outbox = Outbox(
            options.max_memory_bytes,
            options.spill_dir / (self._sealed_name.removesuffix(SUFFIX) + ".live"),
            options.max_spill_bytes,
        )
        self._nc: NATS | None = None
        self._js: Any = None
        self._connected = False
        self._ever_connected = False
        self._connect_failed = False
        self._pickup_pending = True  # until the first pass over leftover files is over
        self.kept_file = ""
        self._closing = threading.Event()
        self._deadline = 0.0
        self._end_status = "ok"
        self.delivered_events = 0
        self._reported_drops = 0
        self._last_report = 0.0
        self._last_error = ""
        self._failures: set[str] = set()
        self.thread = threading.Thread(target=self._thread_main, name="trainvigil-agent", daemon=True)

    # ---- called from the training thread -------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def request_close(self, timeout: float, status: str) -> None:
        self._end_status = wire_text(str(status), MAX_NAME)
        self._deadline = time.monotonic() + timeout
        self._closing.set()

    def stats(self) -> dict[str, Any]:
        """A snapshot for ``Agent.stats()``, safe from any thread: the drop counts are read
        under their lock, the rest are plain numbers the worker replaces (approximate)."""
        return {
            "connected": self._connected,
            "delivered_events": self.delivered_events,
            "pending_events": self._outbox.pending_events,
            "spilled_bytes": self._outbox.spilled_bytes,
            "dropped": self.drops.snapshot(),
            "last_error": self._last_error,
            "kept_file": self.kept_file,
        }

    # ---- the thread ----------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # unreachable by design (every step below catches); counted if not
            self._failed("running the agent thread", exc, "worker_error", 1)
            log.critical("trainvigil: the agent thread stopped; metrics from now on are dropped")

    async def _main(self) -> None:
        connector = asyncio.create_task(self._connect())
        sender = asyncio.create_task(self._send_loop())
        pickup = asyncio.create_task(self._pickup())
        next_flush = time.monotonic() + self.options.flush_interval
        next_heartbeat = time.monotonic()
        try:
            while not self._closing.is_set():
                now = time.monotonic()
                try:
                    if now >= next_flush or len(self._steps) >= self.options.batch_size or self._records:
                        next_flush = now + self.options.flush_interval
                        await self._collect()
                    if now >= next_heartbeat:
                        next_heartbeat = now + self.options.heartbeat_interval
                        self._push_records([self._heartbeat()])
                    self._report_drops()
                except Exception as exc:
                    self._failed("running the agent loop", exc, "worker_error", 1)
                await asyncio.sleep(_POLL)
            try:
                await self._collect()
                self._push_records([self._run_end()])
            except Exception as exc:
                self._failed("flushing at close", exc, "worker_error", 1)
            # A leftover upload under way may finish too; a broker never reached is not waited for.
            while (len(self._outbox) or self._pickup_pending) and time.monotonic() < self._deadline:
                if self._connect_failed and not self._ever_connected:
                    break
                await asyncio.sleep(_POLL)
        finally:
            for task in (connector, sender, pickup):
                task.cancel()
            await asyncio.gather(connector, sender, pickup, return_exceptions=True)
            self._finish()

    def _finish(self) -> None:
        """Keep what was not delivered in a sealed file, for the next agent or ``vigil push``."""
        self._report_drops(force=True)
        pending = self._outbox.pending_events
        if len(self._outbox):
            # Counted as close_timeout, kept or not: close() says False while anything is undelivered.
            # The line below says which, so the drops report above leaves them out.
            self.drops.add("close_timeout", pending)
            url = self.options.nats_url
            why = f"broker {url} did not acknowledge them in time" if self._ever_connected else f"no broker at {url}"
            where = self.options.spill_dir
            try:
                self._outbox.seal(where / self._sealed_name, broker_key(url))
            except Exception as exc:
                log.warning(
                    "trainvigil: %d events lost: not delivered (%s) and not kept, cannot write %s: %s",
                    pending,
                    why,
                    where / self._sealed_name,
                    exc,
                )
                self._outbox.discard_spill()
            else:
                self.kept_file = str(where / self._sealed_name)
                log.warning(
                    "trainvigil: %d events not delivered (%s); kept in %s: the next agent on this machine that "
                    "reaches that broker sends them, or run: vigil push %s",
                    pending,
                    why,
                    self.kept_file,
                    where,
                )

    def _failed(self, doing: str, exc: BaseException, reason: str = "", lost: int = 0) -> None:
        """An unexpected exception: counted (``lost`` events for ``reason``), kept as
        ``last_error``, logged with its traceback the first time this kind happens."""
        self.drops.add(reason, lost)
        self._last_error = f"{doing}: {exc!r}"
        kind = f"{doing}/{type(exc).__name__}"
        if kind not in self._failures:
            self._failures.add(kind)
            log.error(
                "trainvigil: unexpected error %s; %d events dropped [%s], the agent goes on "
                "(logged once per kind; please report it)",
                doing,
                lost,
                reason or "none",
                exc_info=exc,
            )

    async def _close_connection(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._nc.close(), timeout=1.0)

    # ---- batching ------------------------------------------------------------------------

    async def _collect(self) -> None:
        """Drain both deques into encoded messages on the outbox, in GIL-friendly chunks."""
        steps = self._steps
        remaining = len(steps)  # what is there now; later calls pick up the rest
        while remaining:
            builder = StepBatchBuilder()
            while remaining and builder.rows < self.options.batch_size:
                take = min(remaining, _CHUNK, self.options.batch_size - builder.rows)
                self._add(builder, [steps.popleft() for _ in range(take)])
                remaining -= take
                await asyncio.sleep(0)
            self.drops.merge(builder.dropped, builder.notes)
            try:
                batch = builder.finish(time.time())
                if batch is not None:
                    self._push_steps(batch)
            except Exception as exc:
                self._failed("packing or encoding steps", exc, "encode_error", builder.rows)
        records = []
        while self._records:
            records.append(self._records.popleft())
        if records:
            self._push_records(records)

    def _add(self, builder: StepBatchBuilder, chunk: list[Entry]) -> None:
        """``builder.add(chunk)``; if that fails, entry by entry, so only the culprits are lost."""
        try:
            builder.add(chunk)
            return
        except Exception as exc:
            self._failed("packing steps", exc)
        for entry in chunk:
            try:
                builder.add([entry])
            except Exception:
                self.drops.add("build_error", note=f"the log() call for step {describe(entry[0])}")

    def _push_steps(self, batch: StepBatch) -> None:
        """One message for ``batch``, or several when it is larger than the broker takes."""
        payload = self._encode([batch])
        rows = len(batch.step) // 8
        if len(payload) <= _MAX_PAYLOAD:
            self._push(data_subject(self.source.run_id, "metrics"), payload, rows)
        elif rows == 1:
            step = int.from_bytes(batch.step, "little", signed=True)
            self.drops.add("too_large", note=f"step {step} with {len(batch.columns)} metrics")
        else:
            for part in split_step_batch(batch, min(rows, len(payload) // _MAX_PAYLOAD + 1)):
                self._push_steps(part)

    def _push_records(self, records: list[Record]) -> None:
        by_kind: dict[Kind, list[Record]] = {}
        for record in records:
            by_kind.setdefault(_KIND_OF.get(type(record), "run"), []).append(record)
        for kind, group in by_kind.items():
            self._push_group(data_subject(self.source.run_id, kind), group)

    def _push_group(self, subject: str, group: list[Record]) -> None:
        """One message for ``group``; halves when it cannot be encoded or is too large, down to
        the single record at fault, which is dropped and named."""
        try:
            payload = self._encode(group)
        except Exception as exc:
            if len(group) == 1:
                self._failed("encoding a record", exc)
                self.drops.add("encode_error", note=_name(group[0]))
                return
            payload = b""
        if payload and len(payload) <= _MAX_PAYLOAD:
            self._push(subject, payload, len(group))
        elif len(group) > 1:
            half = len(group) // 2
            self._push_group(subject, group[:half])
            self._push_group(subject, group[half:])
        else:
            self.drops.add("too_large", note=f"{_name(group[0])} encodes to {len(payload)} bytes")

    def _encode(self, records: list[Record]) -> bytes:
        self._seq += 1
        return encode(Envelope(source=self.source, seq=self._seq, records=records))

    def _push(self, subject: str, payload: bytes, events: int) -> None:
        # The id is fixed here and stored with the message, so every resend carries the same one.
        msg = OutMsg(subject, f"{self._id_prefix}/{self._seq}", payload, events)
        try:
            held = self._outbox.push(msg)
        except Exception as exc:  # the spill file cannot be written (disk full, permissions)
            self._failed("spilling to disk", exc, "spill_error", events)
            return
        if not held:
            self.drops.add("spill_full", events)

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(
            time=time.time(),
            last_step=as_step(self._last_step()),
            buffered=len(self._steps) + self._outbox.pending_events,
            spilled_bytes=self._outbox.spilled_bytes,
            connected=self._connected,
            dropped=self.drops.snapshot(),
        )

    def _run_end(self) -> RunEnd:
        return RunEnd(
            time=time.time(),
            status=self._end_status,
            last_step=as_step(self._last_step()),
            dropped=self.drops.snapshot(),
        )

    def _report_drops(self, force: bool = False) -> None:
        for note in self.drops.take_notes():
            log.warning("trainvigil: dropped %s", note)
        total = self.drops.total()
        now = time.monotonic()
        if total > self._reported_drops and (force or now - self._last_report > 10.0):
            log.warning("trainvigil: %d events dropped so far %s", total, self.drops.snapshot())
            self._reported_drops = total
            self._last_report = now

    # ---- the broker ----------------------------------------------------------------------

    async def _connect(self) -> None:
        async def on_disconnect() -> None:
            self._connected = False

        async def on_reconnect() -> None:
            self._connected = True

        async def on_error(exc: Exception) -> None:
            self._last_error = repr(exc)
            if not self._ever_connected:  # nats-py retries the first connect itself, reporting each failure here
                self._connect_failed_once(exc)

        delay = 0.1
        while True:
            try:
                self._nc = await nats.connect(
                    nats_servers(self.options.nats_url),
                    name=f"trainvigil-agent {self.source.run_id}/{self.source.rank}",
                    connect_timeout=1,
                    reconnect_time_wait=0.25,
                    max_reconnect_attempts=-1,
                    allow_reconnect=True,
                    disconnected_cb=on_disconnect,
                    reconnected_cb=on_reconnect,
                    error_cb=on_error,
                    pending_size=16 * 2**20,
                )
                self._js = self._nc.jetstream(publish_async_max_pending=self.options.max_inflight * 2)
                self._connected = self._ever_connected = True
                try:
                    await asyncio.Future()  # hold the connection until cancelled
                finally:
                    await self._close_connection()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._last_error = repr(exc)
                self._connect_failed_once(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _connect_failed_once(self, exc: BaseException) -> None:
        """Say once, at the first failed connect, that data is kept and where."""
        if self._connect_failed:
            return
        self._connect_failed = True
        log.warning(
            "trainvigil: no broker answers at %s (%s: %s); metrics are kept locally (in memory, then under %s) and "
            "sent once it answers; what is left at exit stays in %s for the next run or `vigil push`",
            self.options.nats_url,
            type(exc).__name__,
            exc,
            self.options.spill_dir,
            self.options.spill_dir,
        )

    async def _pickup(self) -> None:
        """Once connected, deliver the sealed files earlier runs left in the spill directory for this broker.

        ``_pickup_pending`` is true until the first pass is over and during each later one:
        ``close()`` lets such a pass finish (within its deadline), never a wait between passes.
        """
        failed: list[str] = []
        try:
            for attempt in range(_PICKUP_TRIES):
                while self._js is None or not self._connected:
                    await asyncio.sleep(_POLL)
                self._pickup_pending = True
                failed = []
                for path in leftovers(self.options.spill_dir):
                    result = await upload(
                        self._js,
                        path,
                        max_inflight=self.options.max_inflight,
                        ack_timeout=self.options.ack_timeout,
                        only_for=broker_key(self.options.nats_url),
                    )
                    if result.error:
                        failed.append(f"{path.name}: {result.error}")
                    elif result.done:
                        log.info("trainvigil: delivered %d leftover events from %s", result.events, path)
                self._pickup_pending = False
                if not failed or self._closing.is_set():
                    break
                await asyncio.sleep(2.0 * (attempt + 1))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed("delivering leftover spill files", exc)
        finally:
            self._pickup_pending = False
        if failed:
            log.warning(
                "trainvigil: %d leftover spill file(s) not delivered (%s); they stay in %s for the next run or "
                "`vigil push`",
                len(failed),
                "; ".join(failed[:3]),
                self.options.spill_dir,
            )

    async def _send_loop(self) -> None:
        """Publish the outbox oldest first; drop from it only what JetStream acknowledged."""
        backoff = 0.05
        while True:
            js = self._js
            if js is None or not self._connected or not len(self._outbox):
                await asyncio.sleep(_POLL)
                continue
            try:
                msgs = self._outbox.peek(self.options.max_inflight)
                acked, error = await publish_round(js, msgs, self.options.ack_timeout)
                if error is not None:
                    if isinstance(error, asyncio.CancelledError) and self._closing.is_set():
                        raise error
                    self._last_error = repr(error)
                self._outbox.pop(acked)
                self.delivered_events += sum(m.events for m in msgs[:acked])
                stalled = acked < len(msgs)
            except SpillError as exc:
                self._failed("reading the spill file back", exc, "spill_error", exc.events)
                continue
            except Exception as exc:  # the messages stay in the outbox and are tried again
                self._failed("publishing", exc)
                stalled = True
            if stalled:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            else:
                backoff = 0.05


def _name(record: Record) -> str:
    """How a dropped record is named in the log: an event by its kind, and the step where there is one."""
    kind = getattr(record, "kind", None)
    step = getattr(record, "step", None)
    name = type(record).__name__ if kind is None else f"event {kind!r}"
    return name if step is None else f"{name} at step {step}"
