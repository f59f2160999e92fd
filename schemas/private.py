"""Directories and files only their owner reads: the daemon's history and broker store, the agent's spill files.

What they hold is sensitive: ``run_start`` records a run's command line (secrets passed as arguments with it),
metrics and checkpoint paths. Directories are made mode 0700 and files 0600, whatever the umask; one that exists
with a wider mode is tightened when this user owns it, else the caller is told (and warns). Agent and daemon
share these functions.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["DIR_MODE", "FILE_MODE", "UMASK", "open_private", "private_dir", "private_file"]

DIR_MODE = 0o700
FILE_MODE = 0o600
UMASK = 0o077
"""The umask of a process whose every file is private (the daemon: DuckDB and nats-server create files of their
own, the WAL again after each checkpoint)."""


def _tighten(path: Path) -> str:
    """Take the group and other bits off ``path`` (if there); ``""``, or why it stays open."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return ""
    now = stat.S_IMODE(st.st_mode)
    if not now & 0o077:
        return ""
    if st.st_uid != os.getuid():
        return f"{path} is mode {now:o} and owned by uid {st.st_uid}, not this user: others may read what it holds"
    try:
        path.chmod(now & ~0o077)
    except OSError as exc:
        return f"{path} is mode {now:o} and cannot be made private ({exc.strerror or exc}): others may read it"
    return ""


def private_dir(path: Path) -> str:
    """Create the directory ``path`` mode 0700 (its missing parents as ``mkdir -p`` would), or tighten it to 0700.

    Returns ``""``, or a one-line reason why others may still read it (it belongs to another user, or cannot be
    changed): the caller warns with it.

    Raises:
        OSError: the directory cannot be created.
    """
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return _tighten(path)


def private_file(path: Path) -> str:
    """Tighten the file at ``path`` (if there) to 0600; ``""``, or why others may still read it."""
    return _tighten(path)


def open_private(path: Path, flags: int) -> int:
    """``os.open(path, flags)``, a file created mode 0600 from its first byte, and an existing one tightened to it
    (a file left by an older version, or by a process with another umask).

    Raises:
        OSError: as ``os.open``.
    """
    fd = os.open(path, flags, FILE_MODE)
    try:
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == os.getuid():
            os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd
