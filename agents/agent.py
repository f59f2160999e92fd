"""The in-process agent: the public API a training script calls.

Hot-path rule: ``log()`` and ``event()`` only append to a bounded deque. They never block
on the network and never raise into the training loop; everything else happens on the
:class:`~trainvigil.agents.transport.worker.Worker` thread.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing.util
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from concurrent.futures import Future
from types import TracebackType
from typing import Any, SupportsFloat, cast

from trainvigil._version import __version__
from trainvigil.schemas import Record, RunStart, Source
from trainvigil.schemas.limits import MAX_TEXT

from . import _crash, _current, _sigterm, faults
from ._drops import Drops
from ._redact import redact_argv
from ._values import clean_fields, make_event, wire_text
from .gil import GilResult, GilSampler
from .options import AgentOptions, announce_run_id, resolve
from .transport.columnar import Entry
from .transport.worker import Worker

log = logging.getLogger("trainvigil.agent")

KEEP_WAIT_S = 60.0
"""How much longer than its deadline :meth:`Agent.close` waits for the agent's thread to keep what is
undelivered on local disk: that is local work (packing the last steps, writing the kept file), and a
script that exits right after ``close()`` would lose it all. Only a stuck disk reaches this bound."""

_live: weakref.WeakSet[Agent] = weakref.WeakSet()
_orphans: list[Worker] = []  # a forked child keeps its parent's dead worker alive, never closes it
_now = time.time


class Agent:
    """Streams one training process's metrics to the trainvigil daemon.

    Create it with :func:`trainvigil.init`. Use it as a context manager or call
    :meth:`close`; an interpreter exit also flushes it within ``close_timeout``.
    """

    def __init__(self, options: AgentOptions, config: Mapping[str, Any] | None = None) -> None:
        self.options = options
        self._max_buffer = options.max_buffer if options.enabled else 0
        self._closed = False
        self._drops = Drops()
        refused: list[tuple[str, str]] = []
        self.config = clean_fields("run config", config or {}, refused)
        """What the run declares about itself (``run_start``): hyper-parameters, and the names the
        detectors read (``target_kl``, ``val_metric``, ``eval_metric``); values as event fields take them."""
        for reason, note in refused:
            self._drops.add(reason, note=note)
        self._last_step: int | None = None
        self._crash = ""
        """The uncaught exception the process is ending with ("" while none): its ``run_end`` says so."""
        self._pending: set[Future[Any]] = set()
        self.before_close: list[Callable[[], None]] = []
        """Called first by :meth:`close` (``trainvigil.torch.watch`` flushes its last step here)."""
        self._start()
        _live.add(self)
        _crash.install(lambda: list(_live))
        if options.enabled and options.flush_on_sigterm:
            _sigterm.install(lambda: list(_live))
        atexit.register(_close_at_exit, weakref.ref(self))
        multiprocessing.util.register_after_fork(self, Agent._after_mp_fork)

    def _start(self) -> None:
        opts = self.options
        self.source = Source(
            run_id=opts.run_id,
            rank=opts.rank,
            world_size=opts.world_size,
            local_rank=opts.local_rank,
            host=opts.host,
            pid=os.getpid(),
        )
        self._steps: deque[Entry] = deque()
        self._records: deque[Record] = deque()
        self._worker: Worker | None = None
        self._gil: GilSampler | None = None
        self._wake_at = -1  # log() wakes the worker when this many steps wait; set by the worker (_wake_on_log)
        if not opts.enabled:
            return
        argv = redact_argv(sys.argv) if opts.redact_argv else sys.argv  # the history keeps it: no tokens in it
        argv = [wire_text(arg, MAX_TEXT) for arg in argv]  # a huge or undecodable argument never costs the start
        self._records.append(RunStart(time=time.time(), argv=argv, agent_version=__version__, config=self.config))
        self._worker = Worker(
            opts,
            self.source,
            self._steps,
            self._records,
            self._drops,
            lambda: self._last_step,
            train_thread=threading.get_ident(),  # the thread that calls init() runs the loop, as a rule
            wake_on_log=self._wake_on_log,
        )
        self._worker.start()
        if opts.gil:
            self._gil = GilSampler(opts.gil_interval, self._gil_period, name=opts.run_id).start()

    def _gil_period(self, result: GilResult) -> None:
        self.publish(result.to_record(time.time()))

    @property
    def run_id(self) -> str:
        return self.options.run_id

    @property
    def rank(self) -> int:
        return self.options.rank

    # ---- hot path ------------------------------------------------------------------------

    def log(self, step: int, /, **metrics: SupportsFloat) -> None:
        """Record metrics for ``step``: known names (loss, grad_norm, lr, step_time, samples,
        tokens, reward, entropy, kl) and any custom name. Values are numbers: Python, NumPy
        scalars of any dtype, 0-d (or 1-element) arrays and tensors; arrays and tensors are read
        later, so one changed in place after the call may be recorded with its later value.
        Never blocks and never raises: the values are checked later, on the agent's thread; one
        that is not a number is dropped and counted (``bad_value``), as is a call whose step is
        not an int (``bad_step``) or that finds the buffer full (``queue_full``).
        """
        steps = self._steps
        n = len(steps)
        if n < self._max_buffer:
            steps.append((step, _now(), metrics))
            self._last_step = step
            if n == self._wake_at:  # once per WAKE_EVERY calls: packing them early frees their memory for reuse
                self._wake()
        else:
            self._full()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Declare a long phase without steps (``with vigil.phase("eval"):``): the daemon's ``hang``
        detector allows it ``phase_max_s`` instead of paging a loop that stopped stepping. Two
        ``phase`` events (``state`` start and end) at the last step logged; never raises."""
        self.event("phase", step=self._last_step, name=name, state="start")
        try:
            yield
        finally:
            self.event("phase", step=self._last_step, name=name, state="end")

    def event(self, kind: str, /, step: int | None = None, **fields: Any) -> None:
        """Record a run-level event: ``kind`` names it, ``step`` is an int or ``None``.

        ``fields`` are JSON-like: numbers, strings, bools, ``None``, lists, tuples and dicts
        of those; NumPy and torch scalars become Python numbers and arrays or tensors of up
        to 1024 elements become lists, read now (so later in-place changes do not show).
        Anything else is left out of the event and counted (``bad_field``); so is a step
        that is not an int (``bad_step``, the event goes out without it). Never raises.
        """
        if len(self._records) >= self._max_buffer:
            self._full()
            return
        event, refused = make_event(time.time(), kind, step, fields)
        for reason, note in refused:
            self._drops.add(reason, note=note)
        self._append_record(event)

    def publish(self, record: Record) -> None:
        """Queue any wire record (checkpoint digests and GIL samples come from other threads through
        here); like :meth:`log`, it never blocks and never raises."""
        if len(self._records) < self._max_buffer:
            self._append_record(record)
        else:
            self._full()

    def _append_record(self, record: Record) -> None:
        records = self._records
        records.append(record)
        if len(records) == 1:  # the first since the worker last drained them: records go out at once
            self._wake()

    def _wake_on_log(self, at: int) -> None:
        """The worker's say (from its thread, and before it starts): ``log()`` wakes it when it finds ``at`` steps
        waiting (0: at the next step, while it sleeps through a quiet spell)."""
        self._wake_at = at

    def _wake(self) -> None:
        if self._worker is not None:
            self._worker.wake()

    def _full(self) -> None:
        if self.options.enabled:
            self._drops.add("closed" if self._closed else "queue_full")

    def checkpoint_saved(
        self, path: str, state_dict: Any, step: int | None = None, *, algo: str = "blake3", snapshot: bool = True
    ) -> Future[Any]:
        """Publish the digest of a checkpoint just saved at ``path``; returns at once.

        Hashing runs on a background thread; the returned future resolves to the
        :class:`~trainvigil.agents.digest.StateDigest` once it is queued for the daemon.
        ``snapshot=True`` clones the tensors first so training may change them right away;
        ``snapshot=False`` saves that copy but the tensors must stay unchanged until the
        future is done (see :mod:`trainvigil.agents.checkpoint`).
        """
        from .checkpoint import digest_later, saved_record

        published: Future[Any] = Future()
        self._pending.add(published)

        def done(f: Future[Any]) -> None:
            exc = f.exception()
            if exc is None:
                self.publish(saved_record(f.result(), path, step))
                published.set_result(f.result())
            else:
                self._drops.add("ckpt_digest_failed", note=f"checkpoint digest of {path}")
                log.warning("trainvigil: checkpoint digest of %s not published: %s", path, exc)
                published.set_exception(exc)
            self._pending.discard(published)

        digest_later(state_dict, algo=algo, snapshot=snapshot).add_done_callback(done)
        return published

    # ---- lifecycle -----------------------------------------------------------------------

    def crashed(self, error: str) -> None:
        """The process is ending on an uncaught exception (``Type: message``): called by the
        chained ``sys.excepthook``; the ``run_end`` sent at exit carries it."""
        self._crash = error

    def close(self, timeout: float | None = None, *, status: str = "ok") -> bool:
        """Flush everything buffered and stop, waiting at most ``timeout`` seconds.

        Returns ``True`` when every event reached the broker; ``False`` when anything was
        lost, for any reason: ``stats()["dropped"]`` says what by reason and
        ``stats()["last_error"]`` the last error seen. Events still undelivered at the
        deadline (at once, when no broker was ever reached) are counted (``close_timeout``)
        and kept in a file in ``spill_dir`` for the next agent or ``vigil push``; the log line
        and ``stats()["kept_file"]`` name it. ``timeout`` bounds the wait for the broker; writing
        that file is local work ``close()`` waits for past it (up to :data:`KEEP_WAIT_S`, with a
        warning), so a script that exits right after loses nothing. Safe to call twice.
        """
        if self._closed:
            return self._delivered_all()
        timeout = self.options.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        for hook in list(self.before_close):
            try:
                hook()
            except Exception:
                log.exception("trainvigil: a before-close hook failed")
        futures.wait(list(self._pending), timeout=max(0.0, deadline - time.monotonic()))
        if self._gil is not None:
            self._gil.stop()  # its last, partial period still goes out
        timeout = max(0.0, deadline - time.monotonic())
        self._closed = True
        _current.clear(self)
        self._max_buffer = 0
        worker = self._worker
        if worker is None:
            return self._delivered_all()
        worker.request_close(timeout, status, self._crash)
        worker.thread.join(timeout + 2.0)
        if worker.thread.is_alive():  # past the broker's deadline: what is left is local, keep it
            log.warning(
                "trainvigil: still keeping what was not delivered (%d events packed so far) in %s; "
                "waiting up to %.0f s more",
                worker.stats()["pending_events"],
                self.options.spill_dir,
                KEEP_WAIT_S,
            )
            worker.thread.join(KEEP_WAIT_S)
        return self._delivered_all()

    def flush(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until everything logged before the call is safe.

        Returns ``True`` when all of it was acknowledged by the broker or, while the broker is
        away or stores nothing (no stream yet), written to the spill file (fsynced; sent once it
        acknowledges again, or kept at exit), and nothing
        was dropped so far (as for :meth:`close`: ``stats()["dropped"]`` says what). ``False`` at
        the deadline or when anything was dropped; after :meth:`close`, what ``close()`` returned.
        A disabled agent has nothing to flush: ``True``. Never raises; logging goes on meanwhile.
        """
        if self._worker is None:
            return not self._closed or self._delivered_all()
        try:
            return self._worker.flush(max(0.0, timeout)) if not self._closed else self._delivered_all()
        except Exception:  # never into the training loop
            log.exception("trainvigil: flush() failed")
            return False

    def _delivered_all(self) -> bool:
        worker = self._worker
        finished = worker is None or not worker.thread.is_alive()
        return finished and not self._drops.total()

    def stats(self) -> dict[str, Any]:
        """Delivery counters: connected, delivered/pending events, spilled bytes, drops by
        reason, the last error. Safe to call from any thread at any time."""
        if self._worker is None:
            return {"connected": False, "dropped": self._drops.snapshot()}
        return self._worker.stats()

    def __enter__(self) -> Agent:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Ctrl-C (or a canary runner's SIGINT) is someone stopping the run, not a crash: as at top level.
        crashed = exc_type is not None and not issubclass(exc_type, KeyboardInterrupt)
        if crashed and not self._crash:
            self._crash = _crash.describe(exc_type, exc)  # type: ignore[arg-type]
        self.close(status="error" if crashed else "ok")

    # ---- fork ----------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        """A forked child gets a fresh agent of its own: new buffers, new thread, new
        connection. The parent's buffered events stay with the parent (no duplicates)."""
        self._drops = Drops()
        self._last_step = None
        self._pending = set()
        if self._worker is not None:
            self._worker.forget_lock()
            _orphans.append(self._worker)
        if self._closed:
            self._worker = None
            return
        self._start()

    @staticmethod
    def _after_mp_fork(agent: Agent) -> None:
        # multiprocessing children leave through os._exit, which skips atexit: flush from a
        # multiprocessing finalizer instead (they run before that exit).
        multiprocessing.util.Finalize(agent, agent.close, exitpriority=100)


def _after_fork() -> None:
    for agent in list(_live):
        agent._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork)


def _close_at_exit(ref: weakref.ref[Agent]) -> None:
    agent = ref()
    if agent is not None and not agent._closed:
        agent.close(status="error" if agent._crash else "ok")


def init(
    run_id: str | None = None,
    rank: int | None = None,
    nats_url: str | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    **options: Any,
) -> Agent:
    """Start an agent for this process.

    Args:
        run_id: shared by all ranks of one job; default ``VIGIL_RUN_ID``, else the experiment's name
            in a Ray Train worker, else torchrun's run id, else generated and printed once.
        rank: default the Ray Train worker's world rank, else ``RANK`` from the environment
            (torchrun sets it), else 0. World size likewise.
        nats_url: default ``VIGIL_NATS_URL``, else ``nats://127.0.0.1:4222``.
        config: the run's configuration, sent once in its ``run_start`` (``runs``/``events`` in SQL):
            hyper-parameters, and what detectors read, e.g. ``{"target_kl": 0.015}`` (``kl_explode``),
            ``{"val_metric": "val_nll"}`` (``generalisation``), ``{"eval_metric": ...}`` (``reward_hack``).
            JSON-like values, converted as :meth:`Agent.event` fields are.
        **options: any :class:`~trainvigil.agents.options.AgentOptions` field, e.g.
            ``flush_interval=0.5``.

    Raises:
        ConfigError: an unknown option or an invalid value, or a malformed ``VIGIL_FAULT``
            (before training starts; see :mod:`trainvigil.faults`).
    """
    opts, generated = resolve(run_id, rank, nats_url, options)
    planned = faults.from_env()  # a malformed VIGIL_FAULT stops the run here, before anything starts
    if generated and opts.enabled:
        announce_run_id(opts.run_id)
    agent = Agent(opts, config)
    _current.set_to(agent)
    faults.arm(planned, agent)
    return agent


def current_agent() -> Agent | None:
    """The agent the last :func:`init` started in this process, until it is closed."""
    return cast("Agent | None", _current.get())


__all__ = ["Agent", "current_agent", "init"]
