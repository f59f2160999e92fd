"""A FIFO of encoded messages waiting for the broker: memory first, then an append-only spill file.

Order is kept exactly: once anything is spilled, new messages go to the file too until
the file has been read back, so replay after a reconnect is in the order of ``push``.
Only the publisher thread changes an Outbox; its counters may be read from any thread.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections import deque
from dataclasses import dataclass
from pathlib import Path

_FRAME = struct.Struct("<III")  # subject length, message id length, payload length
_EVENTS = struct.Struct("<I")


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


class Outbox:
    """Bounded FIFO; ``push`` returns ``False`` when the message had to be dropped."""

    def __init__(self, max_memory_bytes: int, spill_path: Path, max_spill_bytes: int) -> None:
        self._memory: deque[OutMsg] = deque()
        self._memory_bytes = 0
        self._memory_events = 0  # kept as a sum so readers on other threads never iterate the deque
        self._max_memory = max_memory_bytes
        self._spill_path = spill_path
        self._max_spill = max_spill_bytes
        self._spill_write: int = 0  # bytes written to the spill file
        self._spill_read: int = 0  # bytes already read back from it
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

    def push(self, msg: OutMsg) -> bool:
        if self.spilled_bytes == 0 and self._memory_bytes + msg.size <= self._max_memory:
            self._hold(msg)
            return True
        return self._spill(msg)

    def _hold(self, msg: OutMsg) -> None:
        self._memory.append(msg)
        self._memory_bytes += msg.size
        self._memory_events += msg.events

    def peek(self, n: int) -> list[OutMsg]:
        """The oldest ``n`` messages (fewer if fewer are held), without removing them."""
        if len(self._memory) < n and self.spilled_bytes:
            self._load(n - len(self._memory))
        return [self._memory[i] for i in range(min(n, len(self._memory)))]

    def pop(self, n: int) -> None:
        """Remove the oldest ``n`` messages (after they were acknowledged)."""
        for _ in range(n):
            msg = self._memory.popleft()
            self._memory_bytes -= msg.size
            self._memory_events -= msg.events

    def _spill(self, msg: OutMsg) -> bool:
        subject, msg_id = msg.subject.encode(), msg.msg_id.encode()
        frame = _FRAME.pack(len(subject), len(msg_id), len(msg.payload)) + _EVENTS.pack(msg.events)
        size = len(frame) + len(subject) + len(msg_id) + len(msg.payload)
        if self.spilled_bytes + size > self._max_spill:
            return False
        self._spill_path.parent.mkdir(parents=True, exist_ok=True)
        # A fresh file when nothing is spilled: bytes left by a file that could not be removed never count.
        with open(self._spill_path, "ab" if self._spill_write else "wb") as f:
            try:
                f.write(frame + subject + msg_id + msg.payload)
                f.flush()
            except OSError:
                # A partial frame would shift every later one: cut the file back, then report.
                with contextlib.suppress(OSError):
                    f.truncate(self._spill_write)
                raise
        self._spill_write += size
        self._spilled_events += msg.events
        return True

    def _load(self, n: int) -> None:
        """Read up to ``n`` messages back from the spill file into memory.

        Raises:
            SpillError: the file is gone or damaged; what it still held is forgotten.
        """
        try:
            self._read(n)
        except (OSError, struct.error, UnicodeDecodeError) as exc:
            lost = self._spilled_events
            self.discard_spill()
            raise SpillError(f"spill file {self._spill_path} unreadable: {exc!r}", lost) from exc
        if self._spill_read >= self._spill_write:
            self.discard_spill()

    def _read(self, n: int) -> None:
        with open(self._spill_path, "rb") as f:
            f.seek(self._spill_read)
            while n > 0 and self._spill_read < self._spill_write:
                head = f.read(_FRAME.size + _EVENTS.size)
                ls, lm, lp = _FRAME.unpack_from(head)
                (events,) = _EVENTS.unpack_from(head, _FRAME.size)
                subject = f.read(ls).decode()
                msg_id = f.read(lm).decode()
                payload = f.read(lp)
                if len(payload) != lp:
                    raise OSError(f"spill file truncated at byte {self._spill_read}")
                self._hold(OutMsg(subject, msg_id, payload, events))
                self._spill_read += len(head) + ls + lm + lp
                self._spilled_events -= events
                n -= 1

    def discard_spill(self) -> None:
        """Forget the spill file (it has been read back in full)."""
        self._spill_write = self._spill_read = self._spilled_events = 0
        with contextlib.suppress(OSError):  # gone already, or left behind: the next spill starts it afresh
            os.unlink(self._spill_path)

    @property
    def spill_path(self) -> Path:
        return self._spill_path
