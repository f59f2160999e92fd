"""Counts of what the agent lost, by reason, shared by the training thread and the worker.

Updates come from the worker (bad values, encoding failures, a full spill file), from the
training thread (a full buffer, a refused event field) and from checkpoint callbacks;
``stats()`` reads them from any thread. A lock keeps a read from meeting a dict that is
changing size. The training thread takes it only when something is dropped, never on the
append path of ``log()``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

DESCRIBED = 5
"""How many drops are logged one by one (what, at which step, why) before only counts grow."""


class Drops:
    """Thread-safe drop counters; the first :data:`DESCRIBED` drops also keep a description."""

    def __init__(self, described: int = DESCRIBED) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._describe_left = described
        self._notes: list[str] = []

    def add(self, reason: str, n: int = 1, note: str = "") -> None:
        """Count ``n`` events lost for ``reason``; ``note`` says which (kept while the budget lasts)."""
        if n <= 0:
            return
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + n
            self._keep(reason, note)

    def merge(self, counts: Mapping[str, int], notes: Iterable[tuple[str, str]] = ()) -> None:
        """Add a batch of counts and their (reason, description) notes at once."""
        with self._lock:
            for reason, n in counts.items():
                if n > 0:
                    self._counts[reason] = self._counts.get(reason, 0) + n
            for reason, note in notes:
                self._keep(reason, note)

    def _keep(self, reason: str, note: str) -> None:
        if note and self._describe_left > 0:
            self._describe_left -= 1
            last = "; further drops are only counted (stats()['dropped'])" if self._describe_left == 0 else ""
            self._notes.append(f"{note} [{reason}]{last}")

    def snapshot(self) -> dict[str, int]:
        """The counts so far, by reason (a copy)."""
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def take_notes(self) -> list[str]:
        """The descriptions not yet logged (each is handed out once)."""
        with self._lock:
            notes, self._notes = self._notes, []
            return notes
