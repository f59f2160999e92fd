"""``vigil alerts --follow`` as a real process, its output lines collected by threads as they come."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from typing import IO, Any


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


class Follower:
    """``vigil alerts --follow ARGS...`` (give ``--format json`` to read alerts with :meth:`next_alert`).

    A context manager: leaving it stops the process (Ctrl-C, then SIGKILL) and closes its pipes.
    """

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        command = [sys.executable, "-m", "trainvigil.daemon.cli", "alerts", "--follow", *args]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        self.alerts: list[dict[str, Any]] = []
        self.readers = [
            threading.Thread(target=_lines, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=_lines, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def following(self, timeout: float = 60) -> str:
        """The first line on stderr: what it follows (``following vigil.v1.alerts.>``), or why it could not."""
        return self.err.get(timeout=timeout)

    def next_alert(self, timeout: float = 30) -> dict[str, Any]:
        """The next alert printed, decoded from its JSON line."""
        alert: dict[str, Any] = json.loads(self.out.get(timeout=timeout))
        self.alerts.append(alert)
        return alert

    def seen(self) -> list[dict[str, Any]]:
        """Every alert printed so far, without waiting."""
        while not self.out.empty():
            self.alerts.append(json.loads(self.out.get()))
        return self.alerts

    def stop(self) -> int | None:
        """Ctrl-C, as a user stops it; its exit status. Killed if it has not exited within 30 s (which raises)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            for reader in self.readers:
                reader.join(10)
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
        return self.proc.returncode
