"""Files the offline commands read that someone else may have made: opened only when they are regular files.

``vigil push``, ``vigil verify`` and ``vigil replay`` read files named on the command line or found where
others may write (a spill directory, a shared checkpoint folder). A FIFO there blocks its reader forever, a
device such as ``/dev/zero`` never ends, and a symbolic link where the reader also writes (a spill file's
delivered mark, its removal) points that write at another file. :func:`open_input` refuses each by kind
before opening: ``lstat`` (``stat`` where a link is fine), then ``open`` with ``O_NONBLOCK`` (a FIFO swapped
in meanwhile does not block the open) and ``O_NOFOLLOW`` where a link is refused, then ``fstat`` on what was
opened: still a regular file, the same one, within the size bound. Agent and daemon share this module.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from trainvigil.errors import VigilError

from .terminal import terminal_safe

__all__ = ["InputRefusedError", "open_input", "read_input"]

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


class InputRefusedError(VigilError, OSError):
    """An input file was refused unread: not a regular file (``kind`` says what it is), or too large."""

    def __init__(self, message: str, *, path: str, kind: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.kind = kind


def _check(path: str, st: os.stat_result, max_bytes: int | None) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise InputRefusedError(
            f"{terminal_safe(path)} is {kind}, not a regular file: refused unread", path=path, kind=kind
        )
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputRefusedError(
            f"{terminal_safe(path)} is {st.st_size} bytes, more than the {max_bytes} read from such a file: refused",
            path=path,
        )


def open_input(path: str | os.PathLike[str], *, max_bytes: int | None, follow_symlinks: bool = False) -> BinaryIO:
    """``path`` opened to read in binary, once it is known to be a regular file of at most ``max_bytes``.

    Args:
        max_bytes: the most the file may hold (``None``: a file read as a stream, whatever its size).
        follow_symlinks: a link to a regular file is read (an input named by the user, a manifest); without it
            a link is refused (a file the reader also changes or removes).

    Raises:
        InputRefusedError: a FIFO, device, socket, directory or (without ``follow_symlinks``) symbolic link,
            or a file larger than ``max_bytes``; nothing was read from it.
        OSError: as ``os.stat`` and ``os.open`` (``FileNotFoundError``, ``PermissionError``).
    """
    where = os.fspath(path)
    before = os.stat(where) if follow_symlinks else os.lstat(where)
    _check(where, before, max_bytes)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(where, flags)
    except OSError:
        if not follow_symlinks and os.path.islink(where):  # swapped for a link since the lstat: ELOOP
            _check(where, os.lstat(where), max_bytes)
        raise
    try:
        opened = os.fstat(fd)
        _check(where, opened, max_bytes)
        if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
            raise InputRefusedError(f"{terminal_safe(where)} was replaced while it was opened; try again", path=where)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | os.PathLike[str], *, max_bytes: int, follow_symlinks: bool = False) -> bytes:
    """The whole of ``path``, opened as :func:`open_input` does, read up to ``max_bytes`` (a file that grew past
    them while being read is refused too).

    Raises:
        InputRefusedError: see :func:`open_input`.
        OSError: as ``open_input``, or reading failed.
    """
    with open_input(path, max_bytes=max_bytes, follow_symlinks=follow_symlinks) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        where = os.fspath(path)
        raise InputRefusedError(f"{terminal_safe(where)} grew past {max_bytes} bytes while it was read", path=where)
    return data
