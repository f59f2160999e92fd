"""A real nats-server and a real ``vigil up`` in a temporary directory, for one recording.

The daemon runs its detectors live while the run trains (their alerts are kept as
``alerts_live``), stores every row in its DuckDB file, and is stopped with SIGTERM (it
drains and commits) before the file is exported.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from trainvigil.daemon.broker.embedded import find_binary, free_port, port_open, server_args
from trainvigil.daemon.cli.sqlclient import ask_daemon
from trainvigil.schemas.query import QueryRequest


class StackError(RuntimeError):
    """The broker or the daemon did not come up, or did not store the run in time."""


def _wait(condition: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise StackError(f"timed out after {timeout:g} s waiting for {what}")


class Stack:
    """``with Stack(workdir) as stack:`` a broker at ``stack.url`` and a daemon storing into ``stack.db``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.data_dir = workdir / "vigil-data"
        self.db = self.data_dir / "vigil.duckdb"
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Stack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        nats = subprocess.Popen(
            server_args(find_binary(), self.port, self.workdir / "js"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._procs.append(nats)
        _wait(lambda: port_open("127.0.0.1", self.port), 15, "nats-server to listen")
        with (self.workdir / "daemon.log").open("ab") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "trainvigil.daemon.cli", "up", "--nats", self.url, "--data-dir",
                 str(self.data_dir), "--http-port", "0"],
                stdout=log, stderr=log, env={**os.environ, "VIGIL_QUERY_ROW_LIMIT": "1000000"},
            )  # fmt: skip
        self._procs.append(daemon)
        _wait(lambda: self.scalar("select 1") == 1, 60, "the daemon to answer queries")
        return self

    def scalar(self, sql: str) -> Any:
        """One value from the running daemon (None while it does not answer)."""
        daemon = self._procs[-1]
        if daemon.poll() is not None:
            raise StackError(f"the daemon exited ({daemon.returncode}); see {self.workdir / 'daemon.log'}")
        try:
            result = asyncio.run(ask_daemon(self.url, QueryRequest(sql=sql, limit=10), 10))
        except Exception:
            return None
        if result is None or result.error or not result.rows:
            return None
        return result.rows[0][0]

    def wait_stored(self, run_id: str, ranks: int, timeout: float = 120.0) -> bool:
        """Until every rank's ``run_end`` is stored (the agent sends it last) and the step count holds still.

        Returns False when some rank's ``run_end`` never came (the steps are waited for all the same).
        """
        ended = f"select count(*) from events where run_id = '{run_id}' and kind = 'run_end'"
        try:
            _wait(lambda: (self.scalar(ended) or 0) >= ranks, timeout, f"{ranks} run_end rows of {run_id}")
        except StackError:
            return False
        finally:
            self._settle(run_id)
        return True

    def _settle(self, run_id: str) -> None:
        counted = f"select count(*) from steps where run_id = '{run_id}'"
        previous = -1
        while (now := self.scalar(counted)) != previous:
            previous = now
            time.sleep(1.0)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for proc in reversed(self._procs):  # the daemon first: it drains and commits on SIGTERM
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
