"""Optimizers for the benchmarker (``vigil bench-optim``), written for speed and checked against references.

:class:`Lion`, :class:`Adan` and :class:`SophiaG` step with ``torch._foreach_*`` over each group's
parameters, decay weights decoupled (AdamW's way) and keep everything in ``state_dict()``;
:class:`Muon` makes ``torch.optim.Muon``'s update of the 2-D weights (equally shaped ones batched)
and takes AdamW for the rest. Sophia-G's Hessian estimate needs a loss of sampled labels: see
:mod:`trainvigil.optim.sophia` for the loop. Needs the ``torch`` extra; imports nothing of the daemon.
"""

from __future__ import annotations

from .adan import Adan
from .lion import Lion
from .muon import Muon
from .sophia import SophiaG, gnb_gaussian_loss, gnb_loss

__all__ = ["Adan", "Lion", "Muon", "SophiaG", "gnb_gaussian_loss", "gnb_loss"]
