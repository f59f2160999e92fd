"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of an interpolated momentum.

``update = sign(beta1 * m + (1 - beta1) * g)``, ``p -= lr * (update + weight_decay * p)`` (decay decoupled,
applied first), then ``m = beta2 * m + (1 - beta2) * g``. One state tensor per parameter (AdamW has two).
Lion wants an LR 3-10x below AdamW's and a weight decay 3-10x above it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ._groups import GroupwiseOptimizer, check, decay, gather, zeros


class Lion(GroupwiseOptimizer):
    """Lion, with ``torch._foreach_*`` over each group's parameters.

    Args:
        params: parameters or param groups.
        lr: learning rate (typically 3-10x smaller than AdamW's).
        betas: ``(beta1, beta2)``: the interpolation for the update, the momentum's decay.
        weight_decay: decoupled, scaled by ``lr``.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        check(lr, betas, weight_decay)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    def _update(self, group: dict[str, Any]) -> None:
        params, grads, (exp_avgs,) = gather(group, self.state, ("exp_avg",), lambda p: {"exp_avg": zeros(p)})
        if not params:
            return
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        decay(params, lr, group["weight_decay"])
        # The interpolation is rounded as the reference rounds it (the sign is discontinuous: another
        # rounding could flip an update near zero); the momentum, continuous, takes one lerp pass.
        update = torch._foreach_mul(exp_avgs, beta1)
        torch._foreach_add_(update, grads, alpha=1.0 - beta1)
        torch._foreach_sign_(update)
        torch._foreach_add_(params, update, alpha=-lr)
        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta2)
