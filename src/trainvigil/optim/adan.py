"""Adan (Xie et al. 2022, "Adaptive Nesterov Momentum Algorithm"), with decoupled weight decay.

With ``d = g - g_prev`` (0 on the first step) and ``u = g + beta2 * d``::

    m = beta1 m + (1 - beta1) g          (betas as decay rates, the reference implementations' convention)
    v = beta2 v + (1 - beta2) d
    n = beta3 n + (1 - beta3) u^2
    p *= 1 - lr * weight_decay
    p -= lr * (m / bc1 + beta2 v / bc2) / (sqrt(n / bc3) + eps)

``bc_i = 1 - beta_i^t`` corrects each moment's bias. The paper's proximal decay divides instead of
multiplying; the decoupled form is AdamW's and matches ``pytorch_optimizer.Adan(weight_decouple=True)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ._groups import GroupwiseOptimizer, check, decay, gather, scale_, shift_, zeros

_KEYS = ("exp_avg", "exp_avg_diff", "exp_avg_sq", "prev_grad")


class Adan(GroupwiseOptimizer):
    """Adan, with ``torch._foreach_*`` over each group's parameters.

    Args:
        params: parameters or param groups.
        lr: learning rate.
        betas: ``(beta1, beta2, beta3)`` decay rates of the gradient, gradient-difference and squared moments.
        weight_decay: decoupled, scaled by ``lr``.
        eps: added to the denominator.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float, float] = (0.98, 0.92, 0.99),
        weight_decay: float = 0.0,
        eps: float = 1e-8,
    ) -> None:
        check(lr, betas, weight_decay)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay, "eps": eps})

    @staticmethod
    def _init(p: Tensor) -> dict[str, Tensor]:
        # prev_grad starts as this step's gradient, so the first difference is 0.
        assert p.grad is not None
        return {"exp_avg": zeros(p), "exp_avg_diff": zeros(p), "exp_avg_sq": zeros(p), "prev_grad": p.grad.clone()}

    def _update(self, group: dict[str, Any]) -> None:
        params, grads, (m, v, n, prev) = gather(group, self.state, _KEYS, self._init)
        if not params:
            return
        group["step"] = t = group.get("step", 0) + 1
        beta1, beta2, beta3 = group["betas"]
        lr = group["lr"]
        # No tensor is allocated: on the CPU a fresh parameter-sized buffer costs several passes (the
        # allocator hands large blocks back to the OS, so each step pays their page faults again).
        # prev_grad is the one scratch buffer: -d, d, u / (1 + beta2), the denominator, and at the
        # end this step's gradient again. Scalars go through scale_/shift_ (a Python scalar costs a
        # wrapped tensor per parameter on the CPU).
        torch._foreach_sub_(prev, grads)
        torch._foreach_neg_(prev)  # d = g - g_prev
        torch._foreach_lerp_(v, prev, 1.0 - beta2)
        torch._foreach_lerp_(prev, grads, 1.0 / (1.0 + beta2))  # (beta2 d + g) / (1 + beta2) = u / (1 + beta2)
        scale_(n, beta3)
        torch._foreach_addcmul_(n, prev, prev, value=(1.0 - beta3) * (1.0 + beta2) ** 2)
        torch._foreach_lerp_(m, grads, 1.0 - beta1)
        # sqrt(n / bc3) + eps = (sqrt(n) + eps * s) / s with s = sqrt(bc3): the 1/s moves into the step sizes.
        s = math.sqrt(1.0 - beta3**t)
        torch._foreach_copy_(prev, n)
        torch._foreach_sqrt_(prev)
        shift_(prev, group["eps"] * s)
        decay(params, lr, group["weight_decay"])
        torch._foreach_addcdiv_(params, m, prev, value=-lr * s / (1.0 - beta1**t))
        torch._foreach_addcdiv_(params, v, prev, value=-lr * beta2 * s / (1.0 - beta2**t))
        torch._foreach_copy_(prev, grads)
