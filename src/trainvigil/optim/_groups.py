"""What every optimizer here shares: one group's tensors as flat lists, its state made on first use.

The step of each optimizer is a handful of ``torch._foreach_*`` calls over these lists, so the
work per step does not grow a Python loop per parameter beyond gathering the lists (as
``torch.optim``'s own foreach implementations do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

State = dict[Tensor, dict[str, Any]]


def gather(
    group: dict[str, Any], state: State, keys: Sequence[str], init: Callable[[Tensor], dict[str, Tensor]]
) -> tuple[list[Tensor], list[Tensor], list[list[Tensor]]]:
    """The group's parameters that have a gradient, their gradients and their state tensors by ``keys``.

    Args:
        group: a param group; parameters without ``.grad`` are left out (as torch.optim does).
        state: the optimizer's ``state``; a parameter seen for the first time gets ``init(p)``.
        keys: which state tensors to return, one list per key, in that order.
    """
    params = [p for p in group["params"] if p.grad is not None]
    for p in params:
        if not state[p]:
            state[p].update(init(p))
    slots = [state[p] for p in params]
    return params, [p.grad for p in params], [[s[k] for s in slots] for k in keys]


def zeros(p: Tensor) -> Tensor:
    return torch.zeros_like(p, memory_format=torch.preserve_format)


def decay(params: list[Tensor], lr: float, weight_decay: float) -> None:
    """Decoupled weight decay (AdamW's): ``p *= 1 - lr * weight_decay``, apart from the gradient."""
    if weight_decay:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)


def check(lr: float, betas: Sequence[float], weight_decay: float) -> None:
    """Refuse hyper-parameters that cannot be meant, naming them."""
    if lr < 0:
        raise ValueError(f"lr must be >= 0, got {lr}")
    if not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas must lie in [0, 1), got {tuple(betas)}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")


L = TypeVar("L")


def run_closure(closure: Callable[[], L] | None) -> L | None:
    """The loss of ``closure``, called with gradients enabled (``step()`` itself runs without)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class GroupwiseOptimizer(torch.optim.Optimizer):
    """An optimizer whose step is the same update on each param group: subclasses write ``_update``."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = run_closure(closure)
        for group in self.param_groups:
            self._update(group)
        return loss

    def _update(self, group: dict[str, Any]) -> None:
        raise NotImplementedError
