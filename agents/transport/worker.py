"""The agent's background thread: batches, encodes and publishes, with its own event loop.

The training thread only appends to two deques. This thread waits for work on events (a timer
for ``flush_interval`` and heartbeats, a wake-up every :data:`WAKE_EVERY` steps logged or
when records are queued, a ``flush()`` or ``close()``), never polling; on each it packs the
buffered steps into the open batch, which is sealed into messages at ``batch_size`` rows or every
``flush_interval``. After a flush interval without a step and with nothing left to seal, it drops
the flush timer until ``log()`` wakes it at the next step (sealed a flush interval later), so an
idle or slow loop's agent wakes per heartbeat, not several times a second. When it wakes and what
each pass is due to do is a pure :class:`~._schedule.WakeSchedule`; this module does the work.
It turns the buffers into messages with a :class:`~.batcher.Batcher` (pure), keeps them in an
:class:`~trainvigil.agents.spill.outbox.Outbox` (memory, then spill file) and publishes the outbox in order through a
:class:`~.publisher.Publisher`, ``max_inflight`` messages per round trip, dropping from it only what
the broker acknowledged. A stalled round is retried with the waits of the one retry policy, silently
(:func:`trainvigil.schemas.settings.quiet_backoff`), and until a round goes through, what is held is kept
on disk as while the broker is away (a broker with no stream yet stores nothing).

The training thread feels this thread only through the GIL: work comes in slices (a chunk of
entries, one message) and a :class:`~._pacing.Pacer` between slices gives the GIL back at least
every ~0.5 ms, so ``log()`` never waits for a whole batch to be encoded.

Without a broker nothing is lost at exit either: the first failed connect is logged once, and
what is undelivered when ``close()`` ends is sealed into a file in the spill directory. Once
connected, this thread also delivers the sealed files earlier runs left there for the same
broker (:mod:`trainvigil.agents.spill.push`), beside its own messages, and first seals the spill
files of agents that were killed (:mod:`trainvigil.agents.spill._orphans`).

No value and no failure ends this thread: what cannot be packed, encoded or held is dropped and
counted by reason (the first few are logged by name), an unexpected exception is logged once per
kind, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainvigil.schemas import Heartbeat, Record, RunEnd, Source, run_token
from trainvigil.schemas.limits import MAX_NAME
from trainvigil.schemas.redact import redact_url
from trainvigil.schemas.settings import quiet_backoff

from .._drops import Drops
from .._stuck import StuckProbe
from .._values import as_step, wire_text
from ..options import AgentOptions
from ..spill._orphans import LIVE, adopt_orphans
from ..spill.outbox import Outbox, OutMsg, SpillError
from ..spill.push import SUFFIX, broker_key, leftovers, sealed_name
from ._alarm import Alarm
from ._pacing import Pacer
from ._schedule import WakeSchedule
from .batcher import Batcher
from .columnar import Entry
from .publisher import NatsPublisher, Publisher

log = logging.getLogger("trainvigil.agent")

WAKE_EVERY = 1024
"""``log()`` wakes a sleeping worker once this many steps wait: packing them early frees the training
thread's metric dicts while their memory is still warm (a tail of ``log()`` otherwise)."""
_PICKUP_TRIES = 3  # passes over leftover files that failed, before leaving them to the next agent
_PICKUP_WAIT = 2.0  # seconds before the second pass (then doubled), under the one retry policy


class StalledError(ConnectionError):
    """A publish round was not acknowledged in full; the rest stays in the outbox and is tried again."""


@dataclass
class FlushRequest:
    """One ``flush()`` call waiting on the worker: ``ok`` once everything logged before it was
    acknowledged or is on disk, and nothing was dropped."""

    deadline: float
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


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
        publisher: Publisher | None = None,
        *,
        train_thread: int | None = None,
        wake_on_log: Callable[[int], None] = lambda at: None,
    ) -> None:
        self.options = options
        self.source = source
        self._steps = steps
        self._wake_on_log = wake_on_log
        """Tells the training thread's ``log()`` to wake this thread when it finds this many steps waiting (before
        its own): :meth:`._schedule.WakeSchedule.log_wakes_at`."""
        self._schedule = WakeSchedule(
            options.flush_interval, options.heartbeat_interval, min(WAKE_EVERY, options.batch_size), time.monotonic()
        )
        self._records = records
        self.drops = drops
        self._last_step = last_step
        # Where the loop is stuck, once no step completed for two heartbeat intervals.
        self._stuck = StuckProbe(train_thread, 2 * options.heartbeat_interval)
        self._pacer = Pacer()
        self._batcher = Batcher(source, options.batch_size, drops, self._failed, options.subjects)
        # The live spill file; what is left at exit goes to a sealed file (push.SUFFIX) beside it.
        self._sealed_name = sealed_name(run_token(source.run_id), source.rank, source.pid, self._batcher.nonce)
        self._outbox = Outbox(
            options.max_memory_bytes,
            options.spill_dir / (self._sealed_name.removesuffix(SUFFIX) + LIVE),
            options.max_spill_bytes,
            broker_key(options.nats_url),
        )
        name = f"trainvigil-agent {source.run_id}/{source.rank}"
        self._publisher: Publisher = publisher or NatsPublisher(options, name, self._pacer, self._noticed)
        self._pushed = 0  # messages put into the outbox so far
        self._settled = 0  # of those, acknowledged or lost (lost ones are counted as drops)
        self._pickup_pending = True  # until the first pass over leftover files is over
        self.kept_file = ""
        self._closing = threading.Event()
        self._deadline = 0.0
        self._end_status = "ok"
        self._end_error = ""
        self._flushes: deque[FlushRequest] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._alarm = Alarm()  # ends _until_woken's sleep
        self._asleep = False
        self._progress = asyncio.Event()
        self.delivered_events = 0
        self._reported_drops = 0
        self._last_report = 0.0
        self._last_error = ""
        self._failures: set[str] = set()
        self._unstored = False
        """The last round was not acknowledged in full (no stream takes the subject, acks time out): what is
        held is kept on disk, as while the broker is away, until a round goes through."""
        self._said_unstored = False
        self.thread = threading.Thread(target=self._thread_main, name="trainvigil-agent", daemon=True)

    # ---- called from other threads -------------------------------------------------------

    def forget_lock(self) -> None:
        """In a forked child, which never runs this worker: close its copy of the parent's spill-file lock,
        so that the parent's spill file can be adopted once the parent dies, even while the child lives."""
        self._outbox.forget_lock()

    def start(self) -> None:
        self._wake_on_log(self._schedule.log_wakes_at(sleeping=False))
        self.thread.start()

    def wake(self) -> None:
        """Have the worker look at the buffers now. Any thread; never raises.

        Only a sleeping worker is woken: a busy one looks at the buffers before it sleeps again,
        and the wake-up (a write to the loop's socket) releases the GIL, which a busy worker
        waiting for it would take from the caller for a whole slice."""
        loop = self._loop
        if self._asleep and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is gone
                loop.call_soon_threadsafe(self._alarm.ring)

    def flush(self, timeout: float) -> bool:
        """Wait until everything buffered before the call is acknowledged or on disk; see ``Agent.flush``."""
        if not self.thread.is_alive() or self._closing.is_set():
            return False
        request = FlushRequest(time.monotonic() + timeout)
        self._flushes.append(request)
        self.wake()
        request.done.wait(timeout)
        return request.ok

    def request_close(self, timeout: float, status: str, error: str = "") -> None:
        self._end_status = wire_text(str(status), MAX_NAME)
        self._end_error = error
        self._deadline = time.monotonic() + timeout
        self._closing.set()
        self.wake()

    def stats(self) -> dict[str, Any]:
        """A snapshot for ``Agent.stats()``, safe from any thread: the drop counts are read
        under their lock, the rest are plain numbers the worker replaces (approximate)."""
        return {
            "connected": self._publisher.connected,
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
        finally:
            for request in self._flushes:
                request.done.set()

    async def _main(self) -> None:
        self._progress = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        tasks = [
            asyncio.create_task(self._publisher.run(self._notify)),
            asyncio.create_task(self._pump()),
            asyncio.create_task(self._pickup()),
        ]
        schedule = self._schedule
        try:
            while not self._closing.is_set():
                now = time.monotonic()
                try:
                    flushes = [self._flushes.popleft() for _ in range(len(self._flushes))]
                    if await self._pack():
                        schedule.packed(now)
                    if schedule.seal_due(now, flushing=bool(flushes)):
                        self._push(self._batcher.seal())
                    self._push(self._batcher.records(self._records))
                    for request in flushes:
                        tasks.append(asyncio.create_task(self._serve_flush(request, self._pushed)))
                    if schedule.heartbeat_due(now):
                        self._push(self._batcher.records(deque([self._heartbeat()])))
                    self._report_drops()
                except Exception as exc:
                    self._failed("running the agent loop", exc, "worker_error", 1)
                await self._until_woken(schedule.rest(now, self._batcher.open_rows))
            try:
                await self._collect()
                self._push(self._batcher.records(deque([self._run_end()])))
            except Exception as exc:
                self._failed("flushing at close", exc, "worker_error", 1)
            # A leftover upload under way may finish too; a broker never reached is not waited for.
            while (len(self._outbox) or self._pickup_pending) and not self._publisher.unreachable:
                if not await self._progressed(self._deadline - time.monotonic()):
                    break
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop = None
            self._finish()

    async def _until_woken(self, wake_at: float) -> None:
        """Block (GIL released) until :meth:`wake` or ``wake_at`` (``time.monotonic()``), unless work came
        meanwhile; through a quiet spell woken by the first step logged, else once :data:`WAKE_EVERY` wait."""
        schedule = self._schedule
        quiet = schedule.quiet
        timeout = wake_at - time.monotonic()
        self._asleep = True  # set before looking: a wake() from now on is not lost
        if quiet:
            # Before looking too: log() appends, then reads it.
            self._wake_on_log(schedule.log_wakes_at(sleeping=True))
        try:
            idle = schedule.idle(len(self._steps)) and not (self._records or self._flushes or self._closing.is_set())
            if idle and timeout > 0:
                await self._alarm.sleep(timeout)
        finally:
            self._asleep = False
            if quiet:
                self._wake_on_log(schedule.log_wakes_at(sleeping=False))
        self._alarm.clear()
        self._pacer.rested()

    def _notify(self) -> None:
        """Something changed (a push, an ack, the connection): wake whoever waits for progress."""
        self._progress.set()
        self._progress = asyncio.Event()

    async def _progressed(self, timeout: float | None = None) -> bool:
        """Wait for the next :meth:`_notify`; ``False`` when ``timeout`` ran out first."""
        if timeout is not None and timeout <= 0:
            return False
        try:
            await asyncio.wait_for(self._progress.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _noticed(self, error: str) -> None:
        self._last_error = error

    def _finish(self) -> None:
        """Keep what was not delivered in a sealed file, for the next agent or ``vigil push``."""
        self._report_drops(force=True)
        pending = self._outbox.pending_events
        if len(self._outbox):
            # Counted as close_timeout, kept or not: close() says False while anything is undelivered.
            # The line below says which, so the drops report above leaves them out.
            self.drops.add("close_timeout", pending)
            url = redact_url(self.options.nats_url)
            why = (
                f"broker {url} did not acknowledge them in time"
                if self._publisher.ever_connected
                else f"no broker at {url}"
            )
            where = self.options.spill_dir
            try:
                self._outbox.seal(where / self._sealed_name)
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
        else:
            self._outbox.discard_spill()  # nothing held: a spill file's lock (if one is left) goes too

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

    # ---- batching ------------------------------------------------------------------------

    async def _pack(self) -> int:
        """Move the buffered steps into the open batch, a chunk per slice of GIL; returns how many there were."""
        waiting = len(self._steps)
        for msgs in self._batcher.pack(self._steps):
            self._push(msgs)
            self._pacer()
            await asyncio.sleep(0)  # let the publisher send what is ready meanwhile
        return waiting

    async def _collect(self) -> None:
        """Everything buffered, onto the outbox."""
        await self._pack()
        self._push(self._batcher.seal())
        self._push(self._batcher.records(self._records))

    def _push(self, msgs: list[OutMsg]) -> None:
        # Onto disk, where a kill loses nothing, while nothing is stored (not while the first connect is under way).
        away = self._away()
        for msg in msgs:
            try:
                held = self._outbox.push(msg, to_disk=away)
            except Exception as exc:  # the spill file cannot be written (disk full, permissions)
                self._failed("spilling to disk", exc, "spill_error", msg.events)
                continue
            if held:
                self._pushed += 1
            else:
                self.drops.add("spill_full", msg.events)
        if msgs:
            self._notify()

    def _away(self) -> bool:
        """The broker is away, or answers but stores nothing: what is held belongs on disk."""
        pub = self._publisher
        return self._unstored or (not pub.connected and (pub.ever_connected or pub.unreachable))

    def _stored_nothing(self, error: BaseException | None) -> None:
        """A round was not acknowledged in full: everything held goes to disk (once per such spell)."""
        if self._unstored:
            return
        self._unstored = True
        if not self._said_unstored and self._publisher.connected:  # a broker that went away is said elsewhere
            self._said_unstored = True
            log.warning(
                "trainvigil: the broker at %s does not acknowledge what is published (%r); messages are kept on "
                "disk (under %s) and sent once it does",
                redact_url(self.options.nats_url),
                error,
                self.options.spill_dir,
            )
        try:
            if not self._outbox.persist():
                log.warning("trainvigil: the spill file would pass max_spill_bytes; messages wait in memory")
        except OSError as exc:
            self._outbox.cannot_spill(exc)

    async def _serve_flush(self, request: FlushRequest, mark: int) -> None:
        """Answer ``request`` once the first ``mark`` messages are acknowledged, or, while the broker
        is away or stores nothing, once every message held is on disk (fsynced); or at its deadline."""
        try:
            while not request.ok:
                if self._settled >= mark:
                    request.ok = True
                elif not self._publisher.connected or self._unstored:
                    request.ok = self._outbox.persist()
                if not request.ok and not await self._progressed(request.deadline - time.monotonic()):
                    break
        except Exception as exc:
            self._failed("flushing", exc)
        finally:
            request.ok = request.ok and not self.drops.total()
            request.done.set()

    # ---- publishing ----------------------------------------------------------------------

    async def _pump(self) -> None:
        """Publish the outbox oldest first while the broker is there; a stalled round is retried."""
        while True:
            while not (self._publisher.connected and len(self._outbox)):
                await self._progressed()
            try:
                try:
                    await self._round()
                except StalledError:
                    await self._retry()
            except Exception as exc:  # the messages stay in the outbox and are tried again
                self._failed("publishing", exc)
                await self._progressed(self.options.retry_wait_max)

    async def _retry(self) -> None:
        """Rounds under the retry policy (its waits, silent) until one goes through; the round that stalled was
        its first attempt."""
        opts = self.options
        for wait in quiet_backoff(opts.retry_wait_initial, opts.retry_wait_max):
            await asyncio.sleep(wait)
            try:
                await self._round()
            except StalledError:
                continue
            return

    async def _round(self) -> None:
        """One round trip of up to ``max_inflight`` messages.

        Raises:
            StalledError: not all were acknowledged (they stay in the outbox).
        """
        if not (self._publisher.connected and len(self._outbox)):
            return
        try:
            msgs = self._outbox.peek(self.options.max_inflight)
        except SpillError as exc:
            self._failed("reading the spill file back", exc, "spill_error", exc.events)
            return
        acked, error = await self._publisher.publish(msgs, self.options.ack_timeout)
        if isinstance(error, asyncio.CancelledError) and self._closing.is_set():
            raise error
        self._outbox.pop(acked)
        self._settled += acked
        self.delivered_events += sum(m.events for m in msgs[:acked])
        if acked:
            self._notify()
        if error is not None:
            self._last_error = repr(error)
        if acked < len(msgs):
            self._stored_nothing(error)
            raise StalledError(f"{acked} of {len(msgs)} messages acknowledged: {error!r}")
        self._unstored = False

    async def _pickup(self) -> None:
        """Once connected, deliver the sealed files earlier runs left in the spill directory for this broker.

        ``_pickup_pending`` is true until the first pass is over and during each later one:
        ``close()`` lets such a pass finish (within its deadline), never a wait between passes.
        """
        failed: list[str] = []
        where = self.options.spill_dir
        waits = quiet_backoff(_PICKUP_WAIT, 2 * _PICKUP_WAIT)
        try:
            for _ in range(_PICKUP_TRIES):
                while not self._publisher.connected:
                    await self._progressed()
                self._pickup_pending = True
                failed = []
                try:
                    await asyncio.to_thread(adopt_orphans, where)  # reads their frames' heads: off this loop
                except RuntimeError:  # the interpreter is exiting (a short script): no thread pool any more
                    adopt_orphans(where)
                for path in leftovers(where):
                    result = await self._publisher.deliver_file(path, broker_key(self.options.nats_url))
                    if result.error:
                        failed.append(f"{path.name}: {result.error}")
                    elif result.done:
                        log.info("trainvigil: delivered %d leftover events from %s", result.events, path)
                self._pickup_pending = False
                self._notify()
                if not failed or self._closing.is_set():
                    break
                await asyncio.sleep(next(waits))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed("delivering leftover spill files", exc)
        finally:
            self._pickup_pending = False
            self._notify()
        if failed:
            log.warning(
                "trainvigil: %d leftover spill file(s) not delivered (%s); they stay in %s for the next run or "
                "`vigil push`",
                len(failed),
                "; ".join(failed[:3]),
                where,
            )

    # ---- records and reports -------------------------------------------------------------

    def _heartbeat(self) -> Heartbeat:
        last_step = as_step(self._last_step())
        return Heartbeat(
            time=time.time(),
            last_step=last_step,
            buffered=len(self._steps) + self._batcher.open_rows + self._outbox.pending_events,
            spilled_bytes=self._outbox.spilled_bytes,
            connected=self._publisher.connected,
            dropped=self.drops.snapshot(),
            stack=self._stuck.sample(last_step),
        )

    def _run_end(self) -> RunEnd:
        return RunEnd(
            time=time.time(),
            status=self._end_status,
            error=self._end_error,
            last_step=as_step(self._last_step()),
            dropped=self.drops.snapshot(),
        )

    def _report_drops(self, force: bool = False) -> None:
        for note in self.drops.take_notes():
            log.warning("trainvigil: dropped %s", note)
        for name, known in self._batcher.names.take_typos():
            log.warning(
                "trainvigil: metric %r resembles the known metric %r; its values are stored as the custom metric "
                "extra[%r] (log it as %r if that is what it is)",
                name,
                known,
                name,
                known,
            )
        total = self.drops.total()
        now = time.monotonic()
        if total > self._reported_drops and (force or now - self._last_report > 10.0):
            log.warning("trainvigil: %d events dropped so far %s", total, self.drops.snapshot())
            self._reported_drops = total
            self._last_report = now
