"""What the torch-side tests share (pure helpers, no fixtures): typed access to the parts of a small model they
poke at, and a stand-in agent that keeps what ``watch()`` and the fault hooks hand it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported by the tests that use it: collecting them stays light
    import torch


class RecordingAgent:
    """A hand-written stand-in for the agent: keeps what is logged, the events sent and the records published."""

    rank = 0

    def __init__(self) -> None:
        self.logged: dict[int, dict[str, float]] = {}
        self.events: list[tuple[str, int | None, dict[str, Any]]] = []
        self.emitted: list[Any] = []
        self.before_close: list[Callable[[], None]] = []

    def log(self, step: int, /, **metrics: float) -> None:
        self.logged.setdefault(step, {}).update(metrics)

    def event(self, kind: str, /, step: int | None = None, **fields: Any) -> None:
        self.events.append((kind, step, fields))

    def publish(self, record: Any) -> None:
        self.emitted.append(record)

    def close(self) -> None:
        for hook in self.before_close:
            hook()

    def of(self, kind: str) -> list[tuple[int | None, dict[str, Any]]]:
        """The events of ``kind``, as (step, fields)."""
        return [(step, fields) for k, step, fields in self.events if k == kind]


def grad_of(p: torch.Tensor) -> torch.Tensor:
    """``p``'s gradient, which the training step has just computed."""
    assert p.grad is not None
    return p.grad


def linear_weight(model: torch.nn.Sequential, index: int) -> torch.Tensor:
    """The weight of the Linear layer at ``index``."""
    import torch

    layer = model[index]
    assert isinstance(layer, torch.nn.Linear)
    return layer.weight
