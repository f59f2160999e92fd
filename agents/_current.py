"""The process's current agent (the last ``trainvigil.init()``), kept apart from the agent module
so that checkpoint hooks publish through it without importing the agent (no import circle)."""

from __future__ import annotations

from typing import Protocol

from trainvigil.schemas import Record


class Publisher(Protocol):
    """What a hook needs of an agent: queue one wire record, never blocking, never raising."""

    def publish(self, record: Record) -> None: ...


_current: Publisher | None = None


def get() -> Publisher | None:
    """The current agent, until it is closed."""
    return _current


def set_to(agent: Publisher | None) -> None:
    global _current
    _current = agent


def clear(agent: Publisher) -> None:
    """Forget ``agent`` if it is the current one (it closed)."""
    global _current
    if _current is agent:
        _current = None
