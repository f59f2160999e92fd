"""Muon's update of its 2-D weights: ``torch.optim.Muon``'s arithmetic, equally shaped matrices batched.

``torch.optim.Muon`` (torch 2.9+) orthogonalises one matrix at a time: about 25 small kernels per
matrix, so a model of many small weights spends its step in dispatch (100 matrices of 32 x 32: 30 ms
on one CPU thread, ten times the rest of the model's AdamW). Here each group of equally shaped
matrices is stacked into one ``[n, rows, cols]`` tensor and goes through the same quintic
Newton-Schulz iteration with 3-D matmuls: the same bfloat16 operands, coefficients and order of
operations. A lone matrix takes torch's own 2-D ops and comes out bit for bit. A stack's 3-D matmul
may sum a dot product's float32 terms in another order: on this project's CPUs 99.98% of elements
come out bit for bit, and a matrix where a near-tie rounds the other way moves by up to ~1% (the
bfloat16 iteration is only that accurate itself: its result's singular values spread over 0.5-1.5).
tests/unit/test_optim.py pins both. Large matrices, where the matmuls dominate, go one at a time
(:data:`BATCH_BELOW`). Torch before 2.9, which has no Muon, gets the same algorithm from here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

from ._groups import State, decay, gather, zeros

# torch.optim.Muon's defaults (Keller Jordan's constants).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-7
ADJUST_LR_FNS = (None, "original", "match_rms_adamw")
BATCH_BELOW = 512 * 512
"""Equally shaped matrices of fewer elements are orthogonalised as one stack; larger ones one at a time:
there the matmuls dominate, and a CPU's 3-D matmul of 1024 x 1024 blocks is a few percent slower than its 2-D one."""


def orthogonalise(update: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> Tensor:
    """The Newton-Schulz orthogonalisation of a matrix, or of each matrix of a stack ``[n, rows, cols]``, in bfloat16.

    Each matrix as ``torch.optim.Muon`` computes it: cast to bfloat16, transposed when taller than
    wide (so the Gram matrix is the smaller one), divided by its Frobenius norm (at least ``eps``),
    then ``steps`` rounds of ``X <- a X + (b A + c A^2) X`` with ``A = X X^T``. ``update`` is not
    changed (it may be a momentum buffer).
    """
    a, b, c = coefficients
    add_product = torch.addmm if update.dim() == 2 else torch.baddbmm
    x = update.to(torch.bfloat16, copy=True)
    tall = update.size(-2) > update.size(-1)
    if tall:
        x = x.mT
    x.div_(x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.mT  # matmul, not bmm: torch.bmm with a transposed operand is 1.5x slower on the CPU
        polynomial = add_product(gram, gram, gram, beta=b, alpha=c)
        x = add_product(x, polynomial, x, beta=a)
    return x.mT if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """``torch.optim.Muon``'s per-matrix LR (``adjust_lr_fn`` one of :data:`ADJUST_LR_FNS`).

    ``None``/``"original"`` scales by ``sqrt(max(1, rows / cols))`` (Keller Jordan's), ``"match_rms_adamw"``
    by ``0.2 sqrt(max(rows, cols))`` (Moonshot's, so that Muon can reuse AdamW's LR).
    """
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return lr * (0.2 * math.sqrt(max(rows, cols)))
    return lr * math.sqrt(max(1, rows / cols))


def muon_update(group: dict[str, Any], state: State) -> None:
    """One Muon step of ``group``'s matrices (torch.optim.Muon's group keys), momentum in ``state``.

    The momentum (``momentum_buffer``, as torch names it) and the Nesterov blend are elementwise, so
    they run over the stacked tensors too; only the parameters' own update goes back per matrix.
    """
    params, grads, (buffers,) = gather(group, state, ("momentum_buffer",), lambda p: {"momentum_buffer": zeros(p)})
    if not params:
        return
    lr, momentum = group["lr"], group["momentum"]
    torch._foreach_lerp_(buffers, grads, 1.0 - momentum)
    decay(params, lr, group["weight_decay"])
    by_shape: defaultdict[torch.Size, list[int]] = defaultdict(list)
    for i, p in enumerate(params):
        by_shape[p.shape].append(i)
    for shape, members in by_shape.items():
        step = -adjusted_lr(lr, group["adjust_lr_fn"], shape)
        batches = [members] if shape.numel() < BATCH_BELOW else [[i] for i in members]
        for batch in batches:
            update = _blend([grads[i] for i in batch], [buffers[i] for i in batch], momentum, group["nesterov"])
            update = orthogonalise(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
            if update.device.type != "cpu":
                # A GPU's foreach add takes its fused path with equal dtypes only (bfloat16 to float32 is exact);
                # the CPU's loops over the tensors either way, and a conversion would be one more buffer.
                update = update.to(params[batch[0]].dtype)
            updates = list(update.unbind(0)) if update.dim() == 3 else [update]
            torch._foreach_add_([params[i] for i in batch], updates, alpha=step)


def _blend(grads: list[Tensor], buffers: list[Tensor], momentum: float, nesterov: bool) -> Tensor:
    """What Muon orthogonalises: the momentum, or (Nesterov) the gradient blended towards it; stacked if several."""
    momenta = buffers[0] if len(buffers) == 1 else torch.stack(buffers)
    if not nesterov:
        return momenta
    return (grads[0] if len(grads) == 1 else torch.stack(grads)).lerp(momenta, momentum)
