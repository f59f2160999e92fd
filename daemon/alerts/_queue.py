"""The webhook's queue of alert updates: bounded, never waits, and a flood cannot starve a page (pure: no I/O).

What it holds and gives back:

- **One place per episode.** An update of an episode already queued takes its place (reason
  ``superseded``): a receiver gets the episode's newest state (``cleared`` after ``open``), and a
  thousand updates of one incident hold one place, not a thousand.
- **Pages first.** Updates of severity ``page`` go out before any ``warn``; within a severity the runs
  take turns (one update of each run with some queued, oldest first), so a run with hundreds queued
  delays another run's page by at most one post per run.
- **On overflow** (``capacity`` updates queued, ``alerts.queue_size``), reason ``queue_full``:
  a warning goes first, never a page: an incoming update pushes out the oldest warning of the run
  that holds the most warnings, and an incoming warning with only pages queued is dropped itself.
  With only pages queued, an incoming page pushes out the oldest page of the run that holds the
  most pages, counting the incoming one (a tie keeps what was queued first): a flood from one run
  only ever pushes out its own updates, the newest of them kept.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator

from trainvigil.schemas import Anomaly

Key = str | int
"""An update's place: its episode, or a number of its own for an update without one."""

SUPERSEDED = "superseded"
QUEUE_FULL = "queue_full"


class _Lane:
    """The queued updates of one severity: per run oldest first, the runs in the order of their turns."""

    def __init__(self) -> None:
        self.runs: dict[str, OrderedDict[Key, None]] = {}

    def add(self, run_id: str, key: Key) -> None:
        self.runs.setdefault(run_id, OrderedDict())[key] = None

    def remove(self, run_id: str, key: Key) -> None:
        keys = self.runs[run_id]
        del keys[key]
        if not keys:
            del self.runs[run_id]

    def take(self) -> tuple[str, Key] | None:
        """The oldest update of the run whose turn it is; that run's turn then comes after every other's."""
        if not self.runs:
            return None
        run_id = next(iter(self.runs))
        keys = self.runs.pop(run_id)
        key, _ = keys.popitem(last=False)
        if keys:
            self.runs[run_id] = keys
        return run_id, key

    def heaviest(self, incoming: str | None) -> str:
        """The run holding the most updates here, ``incoming``'s counted one more (and preferred on a tie)."""

        def weight(run_id: str) -> tuple[int, bool]:
            return len(self.runs.get(run_id, ())) + (run_id == incoming), run_id == incoming

        candidates = [*self.runs, *([incoming] if incoming is not None and incoming not in self.runs else [])]
        return max(candidates, key=weight)

    def order(self) -> Iterator[Key]:
        """Every key in the order :meth:`take` would give them, turn by turn."""
        queues = [list(keys) for keys in self.runs.values()]
        for turn in itertools.zip_longest(*queues):
            yield from (key for key in turn if key is not None)


class AlertQueue:
    """Alert updates waiting for the webhook (see the module's docstring for the rules)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a queue holds at least one update, not {capacity}")
        self.capacity = capacity
        self._items: dict[Key, Anomaly] = {}
        self._pages, self._warns = _Lane(), _Lane()
        self._numbers = itertools.count()

    def __len__(self) -> int:
        return len(self._items)

    def _lane(self, anomaly: Anomaly) -> _Lane:
        return self._pages if anomaly.severity == "page" else self._warns

    def put(self, anomaly: Anomaly) -> list[tuple[Anomaly, str]]:
        """Queue ``anomaly``; returns the updates that left the queue for it (possibly itself), with why."""
        key: Key = anomaly.episode or next(self._numbers)
        lane = self._lane(anomaly)
        old = self._items.get(key)
        if old is not None:
            old_lane = self._lane(old)
            if old_lane is not lane or old.run_id != anomaly.run_id:  # escalated to a page: its lane changes
                old_lane.remove(old.run_id, key)
                lane.add(anomaly.run_id, key)
            self._items[key] = anomaly
            return [(old, SUPERSEDED)]
        dropped: list[tuple[Anomaly, str]] = []
        if len(self._items) >= self.capacity:
            out = self._overflow(anomaly)
            if out is None:
                return [(anomaly, QUEUE_FULL)]
            dropped.append((self._evict(*out), QUEUE_FULL))
        self._items[key] = anomaly
        lane.add(anomaly.run_id, key)
        return dropped

    def _overflow(self, anomaly: Anomaly) -> tuple[_Lane, str, Key] | None:
        """Which queued update makes room for ``anomaly`` (lane, run, key); None: ``anomaly`` itself goes."""
        warn = anomaly.severity != "page"
        if self._warns.runs:
            lane, incoming = self._warns, anomaly.run_id if warn else None
        elif warn:
            return None
        else:
            lane, incoming = self._pages, anomaly.run_id
        run_id = lane.heaviest(incoming)
        keys = lane.runs.get(run_id)
        if not keys:  # the incoming update's run holds the most and has none queued here: it goes itself
            return None
        return lane, run_id, next(iter(keys))

    def _evict(self, lane: _Lane, run_id: str, key: Key) -> Anomaly:
        lane.remove(run_id, key)
        return self._items.pop(key)

    def take(self) -> Anomaly | None:
        """The next update to post (pages first, runs in turn), or None when the queue is empty."""
        for lane in (self._pages, self._warns):
            taken = lane.take()
            if taken is not None:
                return self._items.pop(taken[1])
        return None

    def snapshot(self) -> list[Anomaly]:
        """Every queued update, in the order :meth:`take` would give them now."""
        return [self._items[key] for lane in (self._pages, self._warns) for key in lane.order()]
