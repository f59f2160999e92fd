"""Typed access to the parts of a small torch model that tests poke at (pure helpers, no fixtures)."""

from __future__ import annotations

import torch


def grad_of(p: torch.Tensor) -> torch.Tensor:
    """``p``'s gradient, which the training step has just computed."""
    assert p.grad is not None
    return p.grad


def linear_weight(model: torch.nn.Sequential, index: int) -> torch.Tensor:
    """The weight of the Linear layer at ``index``."""
    layer = model[index]
    assert isinstance(layer, torch.nn.Linear)
    return layer.weight
