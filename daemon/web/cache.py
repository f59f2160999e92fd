"""Answers shared between requests: one query per distinct SQL text per commit.

Many open pages ask the same questions (the runs table, a run's curves); between two commits the
answer cannot change. :class:`SharedAnswers` runs each distinct query once per *generation* (the
broadcaster's commit count) and hands every request of that generation the same answer, also the
requests that arrive while it runs (single flight). A commit starts a new generation; old answers
are dropped as the bounded table fills: it holds :data:`MAX_ENTRIES` answers at most, the least recently
asked for dropped first (an LRU), so a flood of distinct questions (a page per run of thousands) cannot grow it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio

from trainvigil.daemon.web.budget import off_the_clock

T = TypeVar("T")
MAX_ENTRIES = 256
"""Answers kept at most (the least recently asked for go first)."""


class _Entry(Generic[T]):
    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.done = anyio.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


class SharedAnswers(Generic[T]):
    """``get(key, run)``: ``run()``'s result, computed once per key and generation.

    Args:
        generation: the current generation; answers of an older one are never handed out.
    """

    def __init__(self, generation: Callable[[], int], max_entries: int = MAX_ENTRIES) -> None:
        self._generation = generation
        self._max = max_entries
        self._entries: OrderedDict[object, _Entry[T]] = OrderedDict()

    async def get(self, key: object, run: Callable[[], Awaitable[T]]) -> T:
        generation = self._generation()
        entry = self._entries.get(key)
        if entry is None or entry.generation != generation:
            entry = _Entry(generation)
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
            try:
                entry.value = await run()
            except BaseException as exc:
                entry.error = exc
                if self._entries.get(key) is entry:  # a failure is not shared with later requests
                    del self._entries[key]
                raise
            finally:
                entry.done.set()
            return entry.value
        self._entries.move_to_end(key)  # asked for again: the last to go
        async with off_the_clock():  # another request is computing it: waiting costs this one nothing
            await entry.done.wait()
        if entry.error is not None:
            raise entry.error
        return entry.value  # type: ignore[return-value]
