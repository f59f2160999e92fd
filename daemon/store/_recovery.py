"""The writer connection's one state, and the moves between states (pure).

A write that fails for want of memory or disk may leave DuckDB's connection inside an aborted
transaction, and its COMMIT may have committed though it raised (DuckDB does both when out of
memory); a fatal error (a checkpoint that met a full disk) invalidates the database for every
connection. Each of these must be settled before the next write, and the database invalidated
settles the others too, since opening it again reads the offset and the top steps back.
"""

from __future__ import annotations

import enum
import threading


class WriterState(enum.Enum):
    READY = "ready"
    """The connection holds no transaction, and the offset the store knows is the committed one."""
    UNSURE = "unsure"
    """A write failed for want of memory or disk: roll back and read the offset back before writing."""
    INVALIDATED = "invalidated"
    """DuckDB invalidated the database: open it again before writing or reading."""


class Happened(enum.Enum):
    WRITE_FAILED = "write_failed"
    """A write failed for want of memory or disk, or its ROLLBACK failed."""
    INVALIDATED = "invalidated"
    """An error said the database is invalidated (the writer's, or a reader's)."""
    RESUMED = "resumed"
    """The writer rolled back and read the offset back."""
    REOPENED = "reopened"
    """The writer opened the database again."""


_NEXT: dict[tuple[WriterState, Happened], WriterState] = {
    (WriterState.READY, Happened.WRITE_FAILED): WriterState.UNSURE,
    (WriterState.UNSURE, Happened.WRITE_FAILED): WriterState.UNSURE,
    # Opening the database again settles what the failed write left as well.
    (WriterState.INVALIDATED, Happened.WRITE_FAILED): WriterState.INVALIDATED,
    (WriterState.READY, Happened.INVALIDATED): WriterState.INVALIDATED,
    (WriterState.UNSURE, Happened.INVALIDATED): WriterState.INVALIDATED,
    (WriterState.INVALIDATED, Happened.INVALIDATED): WriterState.INVALIDATED,
    (WriterState.UNSURE, Happened.RESUMED): WriterState.READY,
    # A reader found the database invalidated while the writer resumed: it is still to be opened again.
    (WriterState.INVALIDATED, Happened.RESUMED): WriterState.INVALIDATED,
    (WriterState.INVALIDATED, Happened.REOPENED): WriterState.READY,
}
"""Every allowed move; any other is a bug of the writer."""


def advance(state: WriterState, happened: Happened) -> WriterState:
    """The state after ``happened`` in ``state``.

    Raises:
        ValueError: ``happened`` cannot happen in ``state`` (resuming a store that was not unsure).
    """
    try:
        return _NEXT[state, happened]
    except KeyError:
        raise ValueError(f"the store's writer cannot be {happened.value} while {state.value}") from None


class Recovery:
    """The writer's state, moved under a lock of its own: readers on other threads report an
    invalidated database while the writer holds the store's lock."""

    def __init__(self) -> None:
        self._state = WriterState.READY
        self._lock = threading.Lock()

    @property
    def state(self) -> WriterState:
        return self._state

    def __call__(self, happened: Happened) -> WriterState:
        with self._lock:
            self._state = advance(self._state, happened)
            return self._state
