"""A canary job as a process group: started at a niceness with its output in a log file, stopped as a whole.

Each job is the leader of a new session (``start_new_session``), so its group id is its pid and
everything it starts (the ranks of ``two_rank``, a user's data loader workers) is stopped with it:
first SIGINT to the group (Python raises ``KeyboardInterrupt``, so the agent still ends the run
and flushes what it holds), then SIGKILL to whatever is left after ``STOP_GRACE_S``.

A built-in workload runs in a private directory (:func:`working_directory`): whatever it starts with
``python -m`` (the ranks of ``two_rank``) has that directory first on its import path, and nobody
else can put a module there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import anyio
from anyio.abc import Process

STOP_GRACE_S = 3.0
"""Seconds a job gets to end after SIGINT before its group is killed."""


@contextlib.contextmanager
def working_directory(cwd: str | None, *, private: bool) -> Iterator[str | None]:
    """Where a job runs: ``cwd`` (``None``: where the daemon runs), or with ``private`` a fresh directory
    (``mkdtemp``: a random name, mode 0700) removed with whatever the job left in it once the block ends."""
    if not private:
        yield cwd
        return
    path = tempfile.mkdtemp(prefix="vigil-canary-")
    try:
        yield path
    finally:
        # A child that left the job's group may still write there: what cannot be removed stays in the temp dir.
        shutil.rmtree(path, ignore_errors=True)


async def start(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, nice: int, log_path: Path) -> Process:
    """Start ``argv`` as the leader of its own process group, stdout and stderr appended to ``log_path``.

    Raises:
        OSError: the program cannot be started (not found, not executable, ``cwd`` missing).
    """
    command = ["nice", "-n", str(nice), *argv] if nice else list(argv)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:  # the child keeps its own descriptor
        return await anyio.open_process(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to the group; ``False`` once no process of it is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


async def stop(process: Process, grace_s: float = STOP_GRACE_S) -> int | None:
    """End the job's whole group (see the module's docstring); returns the leader's exit status.

    Safe to call on a job that already ended: what it left running in its group is killed.
    Shielded, so a daemon shutting down still leaves nothing behind.
    """
    with anyio.CancelScope(shield=True):
        if process.returncode is None and signal_group(process.pid, signal.SIGINT):
            with anyio.move_on_after(grace_s):
                await process.wait()
        signal_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await process.wait()
    return process.returncode


def last_line(log_path: Path, most: int = 300) -> str:
    """The last non-empty line the job wrote (for an error's detail), at most ``most`` characters."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            tail = log.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:most] if lines else ""


def prune(directory: Path, keep: int) -> None:
    """Keep the ``keep`` newest canary logs in ``directory``."""
    logs = sorted(directory.glob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in logs[keep:]:
        with contextlib.suppress(OSError):
            old.unlink()
