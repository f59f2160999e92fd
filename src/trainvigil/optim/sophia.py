"""Sophia-G (Liu et al. 2023, "Sophia: a Scalable Stochastic Second-order Optimizer"), with its GNB estimator.

The step is a momentum preconditioned by an estimate of the Hessian's diagonal, clipped per
coordinate::

    m = beta1 m + (1 - beta1) g
    p *= 1 - lr * weight_decay
    p -= lr * sign(m) * min(|m| / (rho * h + eps), 1)

``h`` is an exponential average (``beta2``) of the Gauss-Newton-Bartlett estimate, refreshed every
``update_every`` steps. GNB needs something the gradient alone does not have: the loss of labels
*sampled from the model's own prediction*. So the estimate is a call of its own, made on the
steps :attr:`SophiaG.hessian_due` names, with a loss built from the same forward pass::

    logits = model(x)
    loss = F.cross_entropy(logits, y)
    if opt.hessian_due:                                     # every update_every steps, the first included
        opt.update_hessian(gnb_loss(logits), batch_size=len(x))  # before loss.backward(): it keeps the graph
    opt.zero_grad(); loss.backward(); opt.step()

:meth:`SophiaG.update_hessian` takes the gradient ``ĝ`` of that sampled loss (``torch.autograd.grad``;
``.grad`` is not touched) and folds ``batch_size * ĝ²`` into ``h``. :func:`gnb_loss` samples labels
from a categorical prediction, :func:`gnb_gaussian_loss` targets around a regression's output; for a
loss with no likelihood, pass the loss itself (an empirical-Fisher estimate, ``batch_size=1``).
The official code scales ``h`` by the batch size in the step instead; the update is the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from ._groups import GroupwiseOptimizer, check, decay, gather, shifted, zeros

_KEYS = ("exp_avg", "hessian")


def _drawn_on(generator: torch.Generator | None, tensor: Tensor) -> torch.device:
    # A generator draws on its own device (a CPU one beside a CUDA model keeps draws device-independent).
    return tensor.device if generator is None else generator.device


def gnb_loss(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Cross-entropy of ``logits`` ``[..., classes]`` against labels sampled from their own softmax (mean)."""
    flat = logits.reshape(-1, logits.shape[-1])
    probs = torch.softmax(flat.detach().float(), -1).to(_drawn_on(generator, flat))
    sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return F.cross_entropy(flat, sampled.to(flat.device))


def gnb_gaussian_loss(prediction: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Half the squared error of ``prediction`` against targets drawn from ``N(prediction, 1)`` (mean)."""
    on = _drawn_on(generator, prediction)
    noise = torch.randn(prediction.shape, generator=generator, dtype=prediction.dtype, device=on)
    return 0.5 * (prediction - (prediction.detach() + noise.to(prediction.device))).pow(2).mean()


class SophiaG(GroupwiseOptimizer):
    """Sophia with the Gauss-Newton-Bartlett Hessian estimate (see the module's docstring for the loop).

    Args:
        params: parameters or param groups.
        lr: learning rate.
        betas: ``(beta1, beta2)``: decay of the gradient's moment and of the Hessian estimate's.
        rho: the clipping scale: a coordinate moves at most ``lr`` per step.
        weight_decay: decoupled, scaled by ``lr``.
        update_every: ``k``, steps between Hessian estimates.
        eps: added to ``rho * h``.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.965, 0.99),
        rho: float = 0.04,
        weight_decay: float = 0.1,
        update_every: int = 10,
        eps: float = 1e-15,
    ) -> None:
        check(lr, betas, weight_decay)
        if rho <= 0 or update_every < 1:
            raise ValueError(f"rho must be > 0 and update_every >= 1, got {rho} and {update_every}")
        defaults = {"lr": lr, "betas": tuple(betas), "rho": rho, "weight_decay": weight_decay, "eps": eps}
        super().__init__(params, defaults)
        self.update_every = update_every

    @property
    def steps_taken(self) -> int:
        return int(self.param_groups[0].get("step", 0))

    @property
    def hessian_due(self) -> bool:
        """Whether this step should refresh the Hessian estimate (steps 0, k, 2k, ...)."""
        return self.steps_taken % self.update_every == 0

    @torch.no_grad()
    def update_hessian(self, sampled_loss: Tensor, batch_size: int = 1) -> None:
        """Fold ``batch_size * ĝ²``, ``ĝ`` the gradient of ``sampled_loss``, into the Hessian estimate.

        Keeps ``sampled_loss``'s graph (the training loss usually shares it); parameters it does not
        reach get a zero estimate.
        """
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        with torch.enable_grad():
            grads = torch.autograd.grad(sampled_loss, params, retain_graph=True, allow_unused=True)
        estimates = [zeros(p) if g is None else g for p, g in zip(params, grads, strict=True)]
        self.fold_hessian(params, [torch.mul(e, e) for e in estimates], scale=float(batch_size))

    @torch.no_grad()
    def fold_hessian(self, params: Sequence[Tensor], estimates: Sequence[Tensor], scale: float = 1.0) -> None:
        """Fold diagonal estimates ``e`` (one per parameter, any estimator) in: ``h = b2 h + (1 - b2) scale e``."""
        by_param = dict(zip(params, estimates, strict=True))
        for group in self.param_groups:
            mine = [p for p in group["params"] if p in by_param]
            if not mine:
                continue
            for p in mine:
                if not self.state[p]:
                    self.state[p].update(self._init(p))
            hessians = [self.state[p]["hessian"] for p in mine]
            torch._foreach_mul_(hessians, group["betas"][1])
            torch._foreach_add_(hessians, [by_param[p] for p in mine], alpha=(1.0 - group["betas"][1]) * scale)

    @staticmethod
    def _init(p: Tensor) -> dict[str, Tensor]:
        return {"exp_avg": zeros(p), "hessian": zeros(p)}

    def _update(self, group: dict[str, Any]) -> None:
        group["step"] = group.get("step", 0) + 1
        params, grads, (m, h) = gather(group, self.state, _KEYS, self._init)
        if not params:
            return
        lr, rho = group["lr"], group["rho"]
        torch._foreach_lerp_(m, grads, 1.0 - group["betas"][0])
        decay(params, lr, group["weight_decay"])
        # sign(m) * min(|m| / (rho h + eps), 1) is m / (rho h + eps) clamped to [-1, 1], and that is
        # m / (h + eps / rho) clamped to [-rho, rho], over rho: the rho moves into the step size and
        # the denominator takes one pass. The denominator is the step's only new buffer (on the CPU a
        # parameter-sized allocation costs more than a pass); the ratio is made in it, in place.
        ratio = shifted(h, group["eps"] / rho)
        torch._foreach_reciprocal_(ratio)
        torch._foreach_mul_(ratio, m)
        torch._foreach_clamp_min_(ratio, -rho)
        torch._foreach_clamp_max_(ratio, rho)
        torch._foreach_add_(params, ratio, alpha=-lr / rho)
