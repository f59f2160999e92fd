"""Spill files whose agent was killed (SIGKILL, the OOM killer): adopted as sealed files, so nothing on disk is lost.

An agent's spill file (``<name>.live``) is written in the sealed format (:class:`~.outbox.Outbox`): the
header naming its broker, then frames. While the file exists, its agent holds an exclusive ``flock`` on
a lock file beside it (``<name>.lock``, :class:`~._livelock.LiveLock`), taken as the file is created and
removed with it (sealed at exit, or read back in full). The kernel drops that lock when the process
dies, however it dies. :func:`adopt_orphans` (the next agent, ``vigil push``) takes the lock of each
spill file it finds; when it can, the agent is gone, and the file is renamed to the sealed name the
agent would have given it at exit (a frame cut short by the kill is cut off first).

A spill file holds every message not yet acknowledged, from its header's delivered mark on (see
:mod:`.outbox`): the messages in flight at the kill are sent again, with their ``Nats-Msg-Id``, so
JetStream drops those that were stored. A file whose messages were all delivered is removed.
The spill file of an agent that could not create its lock file is left alone: without a lock it
would look dead.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

from ._livelock import lock_path
from .outbox import FRAME_HEAD, frame_length, read_sealed_header, temp_path
from .push import SUFFIX

LIVE = ".live"

log = logging.getLogger("trainvigil.agent")


def adopt_orphans(where: Path) -> list[Path]:
    """Turn the spill files in directory ``where`` whose agent is gone into sealed files; returns those made.

    Never raises: a file that cannot be adopted is logged and left for the next attempt.
    """
    adopted: list[Path] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(where):
            if entry.name.endswith(LIVE) and (sealed := adopt(Path(entry.path))) is not None:
                adopted.append(sealed)
    return adopted


def adopt(live: Path) -> Path | None:
    """The sealed file the spill file ``live`` became, when its agent is gone; else ``None``: its agent
    lives (or had no lock file), or another adopter took it first. Never raises; a failure is logged."""
    lock = lock_path(live)
    try:
        fd = os.open(lock, os.O_RDWR)  # never created here: an agent without one is left alone
    except FileNotFoundError:  # no lock: adopted, or sealed by its agent, meanwhile (or never had one)
        return None
    except OSError as exc:
        log.warning("trainvigil: cannot open %s: %s", lock, exc)
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # its agent is alive
        except OSError as exc:  # a file system without locks: no way to know
            log.warning("trainvigil: cannot lock %s: %s", lock, exc)
            return None
        if not live.exists():  # another adopter had the lock first, and took the file
            return None
        sealed = live.with_suffix(SUFFIX)
        with contextlib.suppress(OSError):  # a copy the kill cut short (Outbox.persist); the file is whole
            os.unlink(temp_path(live))
        try:
            kept = _cut_partial_frame(live)
            if kept:
                os.replace(live, sealed)
            else:
                os.unlink(live)
        except (OSError, ValueError) as exc:  # the lock file stays: tried again next time
            log.warning("trainvigil: cannot adopt the spill file %s of a killed agent: %s", live, exc)
            return None
        with contextlib.suppress(OSError):
            os.unlink(lock)
    finally:
        os.close(fd)
    if not kept:
        return None
    log.info("trainvigil: %s was left by a killed agent; adopted as %s", live.name, sealed.name)
    return sealed


def _cut_partial_frame(live: Path) -> int:
    """Cut off a frame the kill left half-written at the end of ``live``; returns the frames' bytes left.

    Raises:
        ValueError: ``live`` has no sealed header (a file this module does not know).
    """
    with open(live, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:  # killed before its first write
            return 0
        read_sealed_header(f)
        at = start = f.tell()
        while at < size:
            head = f.read(FRAME_HEAD)
            if len(head) < FRAME_HEAD or at + (length := frame_length(head)) > size:
                break
            at += length
            f.seek(at)
        if at < size:
            log.warning("trainvigil: %s ends in a frame cut short by the kill; %d bytes dropped", live, size - at)
            f.truncate(at)
        return at - start
