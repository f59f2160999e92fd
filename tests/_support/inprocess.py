"""The daemon inside the test process: ``vigil up``'s own ``serve`` on an event loop of its own, in a thread.

It starts in what opening the store, the broker's stream and the HTTP side cost, without the ~2.3 s a
``vigil up`` process spends importing and starting. What it shares with the test decides which tests
keep the process daemon (``support.Daemon``, the ``process_daemon`` fixture):

- signals: only a program's main thread receives them, so it stops on an event instead, as it does on
  SIGTERM (drained, committed, acked); nothing can SIGKILL it, and it has no memory or console log apart;
- the GIL: a test that guards against blocking, or times something, keeps a process;
- the umask, which ``serve`` makes private while a daemon runs: meanwhile the test's own files, and the
  processes it starts, are private too, so a test of file modes keeps a process. Whatever order
  overlapping daemons stop in, the umask the test had is set again once the last one stopped;
- DuckDB's file lock, which is a process's: a second daemon on the same data directory is not refused as a
  second ``vigil up`` is;
- the log configuration: its lines go where the test process's structlog and logging send them (pytest's
  capture), not to a file of its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal
from support import SqlOverNats

from trainvigil.daemon.broker.embedded import free_port

if TYPE_CHECKING:
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.schemas.query import QueryResult

START_S = 30.0
"""How long :meth:`InProcessDaemon.wait_ready` waits, as long as a process daemon is given."""
STOP_S = 30.0
"""How long :meth:`InProcessDaemon.terminate` waits for the drain and the commit, as for a process's exit."""

_umask_lock = threading.Lock()
_live = 0
_outside_umask = 0


def _enter_umask() -> None:
    """Before a daemon starts: the test's umask, kept while the first of overlapping daemons runs."""
    global _live, _outside_umask
    with _umask_lock:
        if _live == 0:
            _outside_umask = os.umask(0)
            os.umask(_outside_umask)
        _live += 1


def _leave_umask() -> None:
    """After a daemon stopped: once none runs, the test's umask again (``serve`` restores the one it found, which
    is the private one of another daemon when they overlap and stop in another order than they started)."""
    global _live
    with _umask_lock:
        _live -= 1
        if _live == 0:
            os.umask(_outside_umask)


class InProcessDaemon(SqlOverNats):
    """``vigil up --nats NATS_URL --data-dir DATA_DIR --http-port FREE`` run in a thread of the test process, with
    answers of up to 100 000 rows as :class:`support.Daemon` has; started again after :meth:`terminate` as that
    one is (same ports, same data directory).

    Args:
        nats_url: the broker.
        data_dir: the data directory (created as ``vigil up`` creates it).
        overrides: more settings, dotted keys as ``vigil up``'s flags give them (``{"http_port": 0}``,
            ``{"stream.name": "X"}``); they win over ``env``.
        env: more ``VIGIL_*`` variables, read over the test process's environment as a ``vigil up`` started
            now would read its own.

    If ``serve`` fails, the failure is raised by the next :meth:`sql`, :meth:`terminate` or :meth:`close`
    (a fixture's teardown), once.
    """

    def __init__(
        self,
        nats_url: str,
        data_dir: Path,
        *,
        overrides: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.data_dir = data_dir
        self.env = dict(env or {})
        self.overrides: dict[str, Any] = {"http_port": free_port(), **(overrides or {})}
        self.http_port: int = self.overrides["http_port"]
        self.config: DaemonConfig | None = None
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._stop: anyio.Event | None = None
        self._ready: Future[str] = Future()
        self._serving: Future[None] | None = None
        self._reported = False

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Configure the daemon as ``vigil up`` does and start it without waiting (:meth:`wait_ready` then).

        Raises:
            ConfigError: a setting is invalid, or the data directory cannot be one (``vigil up``'s checks).
        """
        from trainvigil.daemon import config as config_mod
        from trainvigil.daemon.app import serve
        from trainvigil.daemon.cli.cmd_up import check_data_dir

        assert self._portal is None, "this daemon runs already"
        env = {**os.environ, "VIGIL_QUERY_ROW_LIMIT": "100000", **self.env}
        settings = {"nats_url": self.nats_url, "data_dir": str(self.data_dir), **self.overrides}
        config = config_mod.load(None, settings, env=env)
        check_data_dir(config.data_dir)
        self.config = config
        self.subjects = config.subjects  # where sql() asks: the namespace the daemon serves
        self._ready, self._reported = Future(), False
        _enter_umask()
        cm = start_blocking_portal("asyncio", name=f"in-process daemon {self.data_dir}")
        try:
            portal = cm.__enter__()
        except BaseException:
            _leave_umask()
            raise
        self._portal_cm, self._portal = cm, portal
        stop = self._stop = portal.call(anyio.Event)  # made on the daemon's loop: it is awaited there

        async def run() -> None:
            await serve(config, stop=stop, on_ready=self._ready.set_result)

        self._serving = portal.start_task_soon(run)

    def wait_ready(self, timeout: float = START_S) -> None:
        """Wait until the daemon answers queries (``serve`` says it is ready once its responder runs).

        Raises:
            ConfigError: a start-up failure ``vigil up`` explains (the DuckDB file locked, the HTTP port taken).
            TimeoutError: not ready in ``timeout`` seconds (the daemon is stopped).
            Exception: what else ``serve`` raised.
        """
        from trainvigil.daemon.cli.cmd_up import startup_error

        assert self._serving is not None and self.config is not None, "launch() first"
        either: list[Future[Any]] = [self._ready, self._serving]
        wait(either, timeout, FIRST_COMPLETED)
        if self._ready.done():
            return
        if not self._serving.done():
            self._serving.cancel()
            self._close_portal()
            raise TimeoutError(f"the in-process daemon on {self.data_dir} did not start within {timeout:g} s")
        failure = self._failure()
        self._close_portal()
        self._reported = True
        if failure is None:
            raise RuntimeError(f"the in-process daemon on {self.data_dir} stopped before it was ready")
        explained = startup_error(failure, self.config)
        if explained is not None:
            raise explained from failure
        raise failure

    def sql(self, sql: str) -> QueryResult:
        self._raise_failure()
        try:
            return super().sql(sql)
        except Exception:
            self._raise_failure()  # no answer because the daemon died: that is the error to see
            raise

    def terminate(self) -> int:
        """Stop the daemon as SIGTERM does (it drains, commits and acks), and wait for it: 0 once it stopped.

        Raises:
            TimeoutError: it did not stop within :data:`STOP_S` (then it is cancelled).
            Exception: what ``serve`` raised, if it failed.
        """
        self._raise_failure()
        assert self._portal is not None and self._stop is not None and self._serving is not None, "not running"
        self._portal.call(self._stop.set)
        if not wait([self._serving], STOP_S).done:
            self._serving.cancel()
            self._close_portal()
            raise TimeoutError(f"the in-process daemon on {self.data_dir} did not stop within {STOP_S:g} s")
        self._close_portal()
        self._raise_failure()
        return 0

    def close(self) -> None:
        """A fixture's teardown: stop the daemon if it runs; raise its failure if no call raised it yet."""
        if self._portal is not None and self._failure() is None:
            self.terminate()
        self._raise_failure()
        self._close_portal()

    def _failure(self) -> BaseException | None:
        if self._serving is None or not self._serving.done() or self._serving.cancelled():
            return None
        return self._serving.exception()

    def _raise_failure(self) -> None:
        failure = self._failure()
        if failure is not None and not self._reported:
            self._reported = True
            self._close_portal()
            raise failure

    def _close_portal(self) -> None:
        """End the event loop and join its thread; what ``serve`` still runs (cancelled, or unwinding after a
        failure) is waited for: it closes the store and the broker connection on its way out."""
        if self._portal_cm is None:
            return
        cm, self._portal_cm, self._portal = self._portal_cm, None, None
        try:
            cm.__exit__(None, None, None)
        finally:
            _leave_umask()
