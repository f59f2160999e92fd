"""A FIFO of encoded messages waiting for the broker: memory first, then an append-only spill file.

Order is kept exactly: once anything is spilled, new messages go to the file too until
the file has been read back, so replay after a reconnect is in the order of ``push``.
Only the publisher thread changes an Outbox; its counters may be read from any thread.

The spill file starts with a sealed file's header (below), so a spill file whose process was killed
is a sealed file already: :mod:`._orphans` adopts it as one. Messages read back from it stay in it
until JetStream acknowledged them; the header's *delivered mark* says how far that is, rewritten in
place after each round, so a kill loses nothing read back and resends nothing acknowledged.

:meth:`Outbox.seal` moves what is still held into a *sealed* file: :data:`SEALED_MAGIC`, the
delivered mark (16 hex digits: the byte where the first frame not yet delivered starts), a line
naming the broker the messages were meant for, then the frames (subject, ``Nats-Msg-Id``, payload,
events), written under a temporary name and renamed, so a sealed file is always complete.
:mod:`.push` delivers those later, moving the mark as it goes. Files of the first format
(:data:`SEALED_MAGIC_V1`, no mark) are still read.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import struct
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from trainvigil.schemas.private import open_private, private_dir

from ._livelock import LiveLock

log = logging.getLogger("trainvigil.agent")

_FRAME = struct.Struct("<III")  # subject length, message id length, payload length
_EVENTS = struct.Struct("<I")
_HEAD = _FRAME.size + _EVENTS.size
FRAME_HEAD = _HEAD
"""The bytes of a frame before its subject: the three lengths and the events."""
SEALED_MAGIC = b"trainvigil-spill/2\n"
"""The first bytes of a sealed file; then the delivered mark and a newline, the broker's URL and a newline,
then the frames."""
SEALED_MAGIC_V1 = b"trainvigil-spill/1\n"
"""The first format: no delivered mark (a partial delivery rewrites the rest)."""
_MARK = struct.Struct("16s")
_MARK_AT = len(SEALED_MAGIC)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND


@dataclass(frozen=True, slots=True)
class SealedHeader:
    """What a sealed file's header says."""

    broker: str
    """The broker the messages were meant for."""
    markable: bool
    """The header has a delivered mark (:func:`mark_delivered`); the first format has none."""


@dataclass(frozen=True, slots=True)
class OutMsg:
    """One message to publish: ``events`` counts the agent events it carries."""

    subject: str
    msg_id: str
    payload: bytes
    events: int

    @property
    def size(self) -> int:
        return len(self.payload) + len(self.subject) + len(self.msg_id)


class SpillError(OSError):
    """The spill file could not be read back; ``events`` were in it and are lost."""

    def __init__(self, message: str, events: int) -> None:
        super().__init__(message)
        self.events = events


def frame(msg: OutMsg) -> bytes:
    """``msg`` as it is stored on disk."""
    subject, msg_id = msg.subject.encode(), msg.msg_id.encode()
    head = _FRAME.pack(len(subject), len(msg_id), len(msg.payload)) + _EVENTS.pack(msg.events)
    return head + subject + msg_id + msg.payload


def read_frame(f: BinaryIO) -> tuple[OutMsg, int] | None:
    """The next message in ``f`` and its size on disk; ``None`` at the end of the file.

    Raises:
        OSError: the file ends inside a frame.
    """
    head = f.read(_HEAD)
    if not head:
        return None
    if len(head) != _HEAD:
        raise OSError("truncated frame header")
    ls, lm, lp = _FRAME.unpack_from(head)
    (events,) = _EVENTS.unpack_from(head, _FRAME.size)
    body = f.read(ls + lm + lp)
    if len(body) != ls + lm + lp:
        raise OSError("truncated frame")
    msg = OutMsg(body[:ls].decode(), body[ls : ls + lm].decode(), body[ls + lm :], events)
    return msg, _HEAD + len(body)


def frame_length(head: bytes) -> int:
    """The size on disk of the frame that starts with ``head`` (its first :data:`FRAME_HEAD` bytes)."""
    return FRAME_HEAD + sum(_FRAME.unpack_from(head))


def copy_range(f: BinaryIO, start: int, end: int | None = None) -> Iterator[bytes]:
    """The bytes of ``f`` from ``start`` to ``end`` (default: the end of the file), in chunks."""
    f.seek(start)
    left = -1 if end is None else end - start
    while left:
        chunk = f.read(1 << 20 if left < 0 else min(left, 1 << 20))
        if not chunk:
            if left > 0:
                raise OSError(f"file ends {left} bytes early")
            return
        left -= len(chunk)
        yield chunk


def _open_private(path: Path, flags: int) -> io.BufferedWriter:
    """``path`` opened to write (``flags``: :data:`_CREATE` or :data:`_APPEND`), mode 0600 from its first byte:
    a run's messages carry its command line (``run_start``), and with it whatever secret was passed there."""
    return open(open_private(path, flags), "ab" if flags & os.O_APPEND else "wb")


def temp_path(path: Path) -> Path:
    """Where the file at ``path`` is written before it is renamed into place (never a sealed file's name)."""
    return path.with_name(path.name + ".tmp")


def write_sealed(path: Path, broker: str, parts: Iterable[bytes]) -> None:
    """Write a sealed file at ``path``, for ``broker``, holding ``parts`` (frames), all or nothing:
    temporary name, fsync, rename.

    Raises:
        OSError: nothing was written at ``path`` (an earlier file there is untouched).
    """
    tmp = temp_path(path)
    try:
        with _open_private(tmp, _CREATE) as out:
            out.write(sealed_header(broker))
            for part in parts:
                out.write(part)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def sealed_header(broker: str) -> bytes:
    """The bytes a sealed file (and a spill file) starts with, naming ``broker``, nothing delivered yet."""
    tail = b"\n" + broker.encode() + b"\n"
    return SEALED_MAGIC + _mark(len(SEALED_MAGIC) + _MARK.size + len(tail)) + tail


def _mark(at: int) -> bytes:
    return _MARK.pack(b"%016x" % at)


def mark_delivered(path: Path, at: int) -> None:
    """Record in the header of the sealed (or spill) file at ``path`` that its frames before byte ``at``
    were delivered. One write in place: a kill leaves the old mark or the new one, never a mix.

    Raises:
        OSError: the file could not be written (the old mark stays: those frames are sent again).
    """
    fd = os.open(path, os.O_WRONLY)  # not O_APPEND: that would write the mark at the end
    try:
        os.pwrite(fd, _mark(at), _MARK_AT)
    finally:
        os.close(fd)


def read_sealed_header(f: BinaryIO) -> SealedHeader:
    """What the sealed file ``f`` says of itself; ``f`` is left at its first frame not yet delivered.

    Raises:
        ValueError: ``f`` is not a sealed file, or its mark points outside it.
    """
    magic = f.read(len(SEALED_MAGIC))
    mark = None
    if magic == SEALED_MAGIC:
        line = f.readline(_MARK.size + 1)
        with contextlib.suppress(ValueError):
            mark = int(line[:-1], 16) if len(line) == _MARK.size + 1 else None
        if mark is None:
            raise ValueError("not a trainvigil spill file: its delivered mark is unreadable")
    elif magic != SEALED_MAGIC_V1:
        raise ValueError("not a trainvigil spill file")
    if not (line := f.readline(4096)).endswith(b"\n"):
        raise ValueError("not a trainvigil spill file")
    if mark is not None:
        size = os.fstat(f.fileno()).st_size
        if not f.tell() <= mark <= size:
            raise ValueError(f"its delivered mark {mark} is outside its frames ({f.tell()}-{size})")
        f.seek(mark)
    return SealedHeader(line[:-1].decode(), mark is not None)


class Outbox:
    """Bounded FIFO; ``push`` returns ``False`` when the message had to be dropped.

    What is held, oldest first: memory, then the spill file from its read position on. A message in
    memory may be on disk too (read back from the spill file, or moved there by :meth:`persist`): the
    file's bytes from its delivered mark to its read position are exactly those messages. The file is
    removed once JetStream acknowledged everything in it.
    """

    def __init__(self, max_memory_bytes: int, spill_path: Path, max_spill_bytes: int, broker: str = "") -> None:
        """``broker``: the :func:`~.push.broker_key` the spill file's header names (see :mod:`._orphans`)."""
        self._memory: deque[tuple[OutMsg, int]] = deque()
        """Each message with where its frame ends in the spill file, or -1 when it is in memory alone."""
        self._memory_only = 0  # messages in memory alone: sealing the spill file by a rename would lose them
        self._memory_bytes = 0
        self._memory_events = 0  # kept as a sum so readers on other threads never iterate the deque
        self._max_memory = max_memory_bytes
        self._spill_path = spill_path
        self._max_spill = max_spill_bytes
        self._broker = broker
        self._header = sealed_header(broker)
        self._lock = LiveLock(spill_path)
        self._warned = False  # that the spill file cannot be written while memory has room
        self._warned_open = False  # that the spill directory is readable by others
        self._spill_write: int = 0  # the spill file's size, 0 while there is none
        self._spill_read: int = 0  # where in it the messages not yet read back start
        self._delivered: int = 0  # where in it the messages not yet acknowledged start (the header's mark)
        self._spilled_events = 0

    def __len__(self) -> int:
        return len(self._memory) + (1 if self._spill_read < self._spill_write else 0)

    @property
    def memory_bytes(self) -> int:
        return self._memory_bytes

    @property
    def spilled_bytes(self) -> int:
        """Bytes on disk not yet replayed."""
        return self._spill_write - self._spill_read

    @property
    def pending_events(self) -> int:
        """Agent events held, in memory and on disk."""
        return self._memory_events + self._spilled_events

    def push(self, msg: OutMsg, *, to_disk: bool = False) -> bool:
        """Hold ``msg``, behind everything held; ``False`` when it had to be dropped (both bounds reached).

        ``to_disk``: into the spill file even while memory has room (the broker is away: a kill then loses
        nothing written), but into memory all the same when the file cannot be written.
        """
        if self.spilled_bytes == 0 and self._memory_bytes + msg.size <= self._max_memory:
            if to_disk:
                try:
                    if self._spill(msg):
                        return True
                except OSError as exc:
                    self.cannot_spill(exc)
            self._hold(msg, -1)
            return True
        return self._spill(msg)

    def cannot_spill(self, exc: OSError) -> None:
        """Say (once) that the spill file cannot be written, so messages wait in memory."""
        if not self._warned:
            self._warned = True
            log.warning(
                "trainvigil: cannot write the spill file %s (%s); messages wait in memory while the broker is away, "
                "and a kill would lose them",
                self._spill_path,
                exc,
            )

    def _private_dir(self, where: Path) -> None:
        """Create the spill directory (``where``) or make it private; say once when others may still read it."""
        why = private_dir(where)
        if why and not self._warned_open:
            self._warned_open = True
            log.warning("trainvigil: spill directory %s; point VIGIL_SPILL_DIR at a directory of your own", why)

    def _hold(self, msg: OutMsg, end: int) -> None:
        self._memory.append((msg, end))
        self._memory_only += end < 0
        self._memory_bytes += msg.size
        self._memory_events += msg.events

    def peek(self, n: int) -> list[OutMsg]:
        """The oldest ``n`` messages (fewer if fewer are held), without removing them."""
        if len(self._memory) < n and self.spilled_bytes:
            self._load(n - len(self._memory))
        return [self._memory[i][0] for i in range(min(n, len(self._memory)))]

    def pop(self, n: int) -> None:
        """Remove the oldest ``n`` messages (after they were acknowledged); the spill file's delivered mark
        follows, and the file goes once everything in it was acknowledged."""
        delivered = -1
        for _ in range(n):
            msg, end = self._memory.popleft()
            self._memory_bytes -= msg.size
            self._memory_events -= msg.events
            if end < 0:
                self._memory_only -= 1
            else:
                delivered = end
        if delivered < 0:
            return
        self._delivered = delivered
        if delivered == self._spill_write:
            self.discard_spill()
        else:
            self._mark()

    def _mark(self) -> None:
        with contextlib.suppress(OSError):  # the old mark stays: what it covers is sent again after a kill
            mark_delivered(self._spill_path, self._delivered)

    def _spill(self, msg: OutMsg) -> bool:
        data = frame(msg)
        size = len(data)
        if self.spilled_bytes + size > self._max_spill:
            return False
        self._private_dir(self._spill_path.parent)
        # A fresh file when nothing is spilled: bytes left by a file that could not be removed never count.
        fresh = not self._spill_write
        if fresh:
            self._lock.take()
        with _open_private(self._spill_path, _CREATE if fresh else _APPEND) as f:
            try:
                f.write(self._header + data if fresh else data)
                f.flush()
            except OSError:
                # A partial frame would shift every later one: cut the file back, then report.
                with contextlib.suppress(OSError):
                    f.truncate(self._spill_write)
                if fresh:  # no file, no lock
                    self.discard_spill()
                raise
        if fresh:
            self._spill_write = self._spill_read = self._delivered = len(self._header)
        self._spill_write += size
        self._spilled_events += msg.events
        return True

    def _load(self, n: int) -> None:
        """Read up to ``n`` messages back from the spill file into memory (they stay in the file too).

        Raises:
            SpillError: the file is gone or damaged; what it still held is forgotten.
        """
        try:
            self._read(n)
        except (OSError, struct.error, UnicodeDecodeError) as exc:
            lost = self._spilled_events
            self.discard_spill()
            raise SpillError(f"spill file {self._spill_path} unreadable: {exc!r}", lost) from exc

    def _read(self, n: int) -> None:
        with open(self._spill_path, "rb") as f:
            f.seek(self._spill_read)
            while n > 0 and self._spill_read < self._spill_write:
                item = read_frame(f)
                if item is None:
                    raise OSError(f"spill file truncated at byte {self._spill_read}")
                msg, size = item
                self._spill_read += size
                self._hold(msg, self._spill_read)
                self._spilled_events -= msg.events
                n -= 1

    def discard_spill(self) -> None:
        """Forget the spill file (everything in it was delivered, or it is given up): messages read back
        from it stay held, in memory alone."""
        self._spill_write = self._spill_read = self._delivered = self._spilled_events = 0
        if self._memory_only < len(self._memory):
            self._memory = deque((msg, -1) for msg, _ in self._memory)
            self._memory_only = len(self._memory)
        with contextlib.suppress(OSError):  # gone already, or left behind: the next spill starts it afresh
            os.unlink(self._spill_path)
        self._lock.release()

    def _sync_spill(self) -> None:
        with open(self._spill_path, "rb") as f:
            os.fsync(f.fileno())

    def forget_lock(self) -> None:
        """In a forked child: close the copy of the parent's spill-file lock, which stays the parent's."""
        self._lock.forget()

    def persist(self) -> bool:
        """Put every message held on disk, order kept, and fsync the spill file. Messages in memory stay
        there too (a round in flight still waits for their acks). ``False`` when it would pass
        ``max_spill_bytes`` (nothing moved).

        Raises:
            OSError: the file could not be written; the outbox is unchanged.
        """
        if not self._memory_only:  # all on disk already (the broker is away): no copy, an fsync
            if self._spill_write:
                self._sync_spill()
            return True
        frames = [frame(msg) for msg, _ in self._memory]
        size = sum(map(len, frames))
        if self.spilled_bytes + size > self._max_spill:
            return False
        self._private_dir(self._spill_path.parent)
        # Memory holds the oldest messages (new ones go to the file while it has any unread): they go first.
        tmp = temp_path(self._spill_path)
        self._lock.take()
        try:
            with _open_private(tmp, _CREATE) as out:
                out.write(self._header)
                out.writelines(frames)
                if self.spilled_bytes:
                    with open(self._spill_path, "rb") as f:
                        out.writelines(copy_range(f, self._spill_read, self._spill_write))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self._spill_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        end = self._delivered = len(self._header)
        moved: deque[tuple[OutMsg, int]] = deque()
        for (msg, _), data in zip(self._memory, frames, strict=True):
            end += len(data)
            moved.append((msg, end))
        self._memory, self._memory_only = moved, 0
        self._spill_write, self._spill_read = end + self.spilled_bytes, end
        return True

    def seal(self, path: Path) -> int:
        """Move every message still held, oldest first, into a new sealed file at ``path``, for this outbox's broker.

        Returns the events it holds; the outbox is empty afterwards.

        Raises:
            OSError: the file could not be written; the outbox is unchanged.
        """
        events = self.pending_events
        self._private_dir(path.parent)
        if self._spill_write and not self._memory_only:
            # The spill file from its delivered mark on holds everything: that sealed file is there already.
            self._mark()
            self._sync_spill()
            os.replace(self._spill_path, path)
        else:

            def parts() -> Iterator[bytes]:
                for msg, _ in self._memory:
                    yield frame(msg)
                if self.spilled_bytes:
                    with open(self._spill_path, "rb") as f:
                        yield from copy_range(f, self._spill_read, self._spill_write)

            write_sealed(path, self._broker, parts())
        self._memory.clear()
        self._memory_only = self._memory_bytes = self._memory_events = 0
        self.discard_spill()
        return events
