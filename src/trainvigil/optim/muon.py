"""Muon as its authors use it: ``torch.optim.Muon`` on the 2-D weights, AdamW on everything else.

Muon orthogonalises each matrix's momentum by a Newton-Schulz iteration, which only means
something for a 2-D weight; biases, norms' gains and embeddings-as-vectors take AdamW. torch
ships Muon (``torch.optim.Muon``, 2.9 and later), so this is only the split: one optimizer whose
``param_groups`` are the two inner optimizers' groups (an LR schedule that sets ``group["lr"]``
reaches both) and whose ``state`` they share, so ``state_dict()`` round-trips like any optimizer's.
The Newton-Schulz iteration is per matrix (shapes differ): torch loops over the 2-D weights;
AdamW runs with ``foreach=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from ._groups import run_closure


class Muon(torch.optim.Optimizer):
    """Muon (2-D parameters) + AdamW (the rest) as one optimizer.

    Args:
        params: parameters (param groups are not taken: the split decides the groups).
        lr: Muon's learning rate (scaled per matrix by ``torch.optim.Muon``'s ``adjust_lr_fn``).
        momentum: Muon's momentum (Nesterov).
        weight_decay: decoupled, for both parts.
        adamw_lr: AdamW's learning rate for the non-matrix parameters.
        adamw_betas: AdamW's betas.
        adjust_lr_fn: ``torch.optim.Muon``'s; ``"match_rms_adamw"`` lets Muon share AdamW's LR scale.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 0.02,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
        adamw_lr: float = 3e-4,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adjust_lr_fn: str | None = None,
    ) -> None:
        params = [p for p in params if p.requires_grad]
        if any(isinstance(p, dict) for p in params):
            raise TypeError("Muon takes parameters, not param groups: it splits them into 2-D and the rest itself")
        matrices = [p for p in params if p.ndim == 2]
        rest = [p for p in params if p.ndim != 2]
        self._parts: list[torch.optim.Optimizer] = []
        if matrices:
            self._parts.append(
                torch.optim.Muon(
                    matrices, lr=lr, momentum=momentum, weight_decay=weight_decay, adjust_lr_fn=adjust_lr_fn
                )
            )
        if rest:
            self._parts.append(
                torch.optim.AdamW(rest, lr=adamw_lr, betas=adamw_betas, weight_decay=weight_decay, foreach=True)
            )
        groups = [g for part in self._parts for g in part.param_groups]
        super().__init__(groups, {})
        self._link()

    def _link(self) -> None:
        """The inner optimizers use this one's group dicts and state (after init and after a load)."""
        at = 0
        for part in self._parts:
            n = len(part.param_groups)
            part.param_groups = self.param_groups[at : at + n]
            part.state = self.state
            at += n

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = run_closure(closure)
        for part in self._parts:
            part.step()
        return loss
