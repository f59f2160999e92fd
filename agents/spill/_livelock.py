"""The lock an agent holds on its spill file while it lives; see :mod:`._orphans` for who takes it after."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

LOCK = ".lock"


def lock_path(live: Path) -> Path:
    """The lock file of the spill file ``live``."""
    return live.with_suffix(LOCK)


log = logging.getLogger("trainvigil.agent")


class LiveLock:
    """The lock that says an agent's spill file (``live``) is in use: held from :meth:`take` to :meth:`release`."""

    def __init__(self, live: Path) -> None:
        self.path = lock_path(live)
        self._fd = -1
        self._warned = False

    def take(self) -> bool:
        """Create the lock file and lock it (if not held yet); ``False`` when it cannot be (logged once)."""
        if self._fd >= 0:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError as exc:
            self._failed("create", exc)
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            self._failed("lock", exc)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        """Remove the lock file, then unlock it (the spill file is gone by now). Idempotent."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self.forget()

    def forget(self) -> None:
        """Close this process's handle without removing the file: a forked child's copy of its parent's lock."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _failed(self, doing: str, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "trainvigil: cannot %s %s (%s): if killed, this agent's spill file is not sent", doing, self.path, exc
            )
