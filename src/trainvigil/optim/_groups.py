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


def _plain_cpu(tensors: list[Tensor]) -> bool:
    """Float32 tensors on the CPU, where a scalar is better passed as a 0-d tensor (see :func:`scale_`)."""
    return tensors[0].device.type == "cpu" and all(t.dtype is torch.float32 for t in tensors)


def scale_(tensors: list[Tensor], factor: float) -> None:
    """``t *= factor`` for each tensor, bit for bit as ``torch._foreach_mul_(tensors, factor)``.

    On the CPU, ``_foreach_*`` loops over the tensors, and a Python scalar is wrapped into a fresh
    0-d tensor for every one of them: on 200 small tensors that is 3-4x the cost of the product. One
    0-d float32 tensor made here is the same operand (the kernel computes in float32 either way) at
    the cost of one allocation. Other dtypes and devices take the scalar, as before.
    """
    if tensors:
        torch._foreach_mul_(tensors, torch.tensor(factor) if _plain_cpu(tensors) else factor)


def _addend(tensors: list[Tensor], value: float) -> float | list[Tensor]:
    # _foreach_add's tensor-list form takes 0-d operands as they are (why: scale_).
    return [torch.tensor(value)] * len(tensors) if _plain_cpu(tensors) else value


def shift_(tensors: list[Tensor], value: float) -> None:
    """``t += value`` for each tensor, bit for bit as ``torch._foreach_add_(tensors, value)`` (why: :func:`scale_`)."""
    if tensors:
        torch._foreach_add_(tensors, _addend(tensors, value))


def shifted(tensors: list[Tensor], value: float) -> list[Tensor]:
    """``t + value`` for each tensor, as new tensors (:func:`shift_` out of place)."""
    return list(torch._foreach_add(tensors, _addend(tensors, value))) if tensors else []


def decay(params: list[Tensor], lr: float, weight_decay: float) -> None:
    """Decoupled weight decay (AdamW's): ``p *= 1 - lr * weight_decay``, apart from the gradient."""
    if weight_decay:
        scale_(params, 1.0 - lr * weight_decay)


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
