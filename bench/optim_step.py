"""Step time of trainvigil.optim's optimizers vs their reference implementations and vs AdamW(foreach=True).

Two models: a 4 x Linear(1024) MLP (4.2 M parameters in 8 tensors) and 100 x Linear(32, 32)
(200 small tensors, where per-tensor overhead dominates). Gradients are fixed random tensors set
once, so only ``optimizer.step()`` is timed. Each optimizer, its references and AdamW are built
side by side and timed in interleaved blocks (one block of each in turn, ``--repeats`` rounds after
a warm-up, every other round in reverse), so a burst of load on a shared machine hits them alike.
A block is ``--steps`` steps, fewer for a slow optimizer (about ``--block-s`` seconds). The median
block's time per step is reported. One intra-op thread unless ``--threads``.

References: ``lion-pytorch`` (Lion), ``pytorch-optimizer``'s ``Adan(foreach=True)``,
``SophiaH(foreach=True)`` (the same clipped step as Sophia-G; its Hessian estimate given once,
not refreshed while timed), and for Muon both ``torch.optim.Muon`` + ``AdamW(foreach=True)`` (what
trainvigil's Muon reproduces, the test oracle) and ``pytorch-optimizer``'s ``Muon`` (its own batched
Newton-Schulz, AdamW on the rest). A reference that is not installed is left out.

    python bench/optim_step.py            # --steps 50 --repeats 5
    python bench/optim_step.py --check    # exit 1 unless every ratio to a reference is <= 1.0
                                          # and Lion and Adan are <= 1.3x AdamW
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from tables import table
from torch import nn

from trainvigil.optim import Adan, Lion, Muon, SophiaG

LR, WD = 1e-3, 0.01
MUON_LR = 0.02
ADAMW_BOUND = 1.3
"""The bound for Lion and Adan against AdamW(foreach=True)."""


class Steppable(Protocol):
    """What is timed: an optimizer, or two stepped together (a reference Muon)."""

    @property
    def state(self) -> Any: ...

    def step(self) -> Any: ...


Factory = Callable[[list[nn.Parameter]], Steppable]


def models() -> dict[str, Callable[[], nn.Module]]:
    return {
        "mlp 4x1024": lambda: nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(4))),
        "200 small": lambda: nn.Sequential(*(nn.Linear(32, 32) for _ in range(100))),
    }


def adamw(p: list[nn.Parameter]) -> Steppable:
    return torch.optim.AdamW(p, lr=LR, weight_decay=WD, foreach=True)


def _sophia(p: list[nn.Parameter]) -> Steppable:
    opt = SophiaG(p, lr=LR, weight_decay=WD, update_every=10**9)
    opt.fold_hessian(p, [torch.rand_like(q) for q in p])
    return opt


OURS: dict[str, Factory] = {
    "lion": lambda p: Lion(p, lr=LR, weight_decay=WD),
    "adan": lambda p: Adan(p, lr=LR, weight_decay=WD),
    "sophia": _sophia,
    "muon": lambda p: Muon(p, lr=MUON_LR, weight_decay=WD, adamw_lr=LR),
}


class TorchMuon:
    """``torch.optim.Muon`` on the matrices and ``AdamW(foreach=True)`` on the rest, stepped together."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        matrices = [q for q in params if q.ndim == 2]
        rest = [q for q in params if q.ndim != 2]
        self.parts = [
            torch.optim.Muon(matrices, lr=MUON_LR, weight_decay=WD),  # type: ignore[attr-defined]
            torch.optim.AdamW(rest, lr=LR, betas=(0.9, 0.95), weight_decay=WD, foreach=True),
        ]

    @property
    def state(self) -> dict[torch.Tensor, dict[str, Any]]:
        return {k: v for part in self.parts for k, v in part.state.items()}

    def step(self) -> None:
        for part in self.parts:
            part.step()


def references() -> dict[str, dict[str, Factory]]:
    """Each optimizer's installed references, by label."""
    refs: dict[str, dict[str, Factory]] = {name: {} for name in OURS}
    if hasattr(torch.optim, "Muon"):
        refs["muon"]["torch.optim.Muon+AdamW"] = TorchMuon
    try:
        from lion_pytorch import Lion as RefLion

        refs["lion"]["lion-pytorch"] = lambda p: RefLion(p, lr=LR, weight_decay=WD)
    except ImportError:
        pass
    try:
        import pytorch_optimizer as po
    except ImportError:
        return refs
    refs["adan"]["pytorch-optimizer"] = lambda p: po.Adan(p, lr=LR, weight_decay=WD, weight_decouple=True, foreach=True)

    def sophia(p: list[nn.Parameter]) -> Steppable:
        opt = po.SophiaH(p, lr=LR, weight_decay=WD, update_period=10**9, foreach=True)
        opt.step(hessian=[torch.rand_like(q) for q in p])  # the estimate once, outside the timing
        return opt

    def muon(p: list[nn.Parameter]) -> Steppable:
        groups = [
            {"params": [q for q in p if q.ndim == 2], "use_muon": True},
            {"params": [q for q in p if q.ndim != 2], "use_muon": False},
        ]
        return po.Muon(groups, lr=MUON_LR, weight_decay=WD, adamw_lr=LR, adamw_wd=WD)

    refs["sophia"]["pytorch-optimizer"] = sophia
    refs["muon"]["pytorch-optimizer"] = muon
    return refs


def parameters(make_model: Callable[[], nn.Module], device: str | torch.device = "cpu") -> list[nn.Parameter]:
    """A fresh model's parameters on ``device``, their gradients fixed random tensors (the same each time)."""
    torch.manual_seed(0)
    params = list(make_model().to(device).parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    return params


def time_side_by_side(
    make_model: Callable[[], nn.Module], factories: dict[str, Factory], steps: int, repeats: int, block_s: float
) -> dict[str, float]:
    """Median seconds per ``step()`` of each factory's optimizer, timed in interleaved blocks.

    After a warm-up (optimizer state is made on the first step), one step of each gives the block
    length: ``steps``, or fewer so that the slowest optimizer's block lasts about ``block_s``. The
    rounds alternate their order.
    """
    opts = {name: factory(parameters(make_model)) for name, factory in factories.items()}
    blocks: dict[str, list[float]] = {name: [] for name in opts}
    with torch.no_grad():
        slowest = 0.0
        for opt in opts.values():
            opt.step()
            started = time.perf_counter()
            opt.step()
            slowest = max(slowest, time.perf_counter() - started)
        n = max(1, min(steps, round(block_s / slowest)))
        for round_ in range(repeats):
            # Every other round in reverse: a block's place in the round (cache, what ran before) evens out.
            for name, opt in list(opts.items())[:: -1 if round_ % 2 else 1]:
                started = time.perf_counter()
                for _ in range(n):
                    opt.step()
                blocks[name].append((time.perf_counter() - started) / n)
    return {name: statistics.median(b) for name, b in blocks.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="steps per block (fewer for a slow optimizer)")
    parser.add_argument("--repeats", type=int, default=5, help="blocks per optimizer; the median is reported")
    parser.add_argument("--block-s", type=float, default=0.5, help="a block's length for a slow optimizer")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", action="append", choices=sorted(OURS), help="these optimizers (default: all)")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every target holds")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    refs = references()
    rows, missed = [], []
    for model_name, make in models().items():
        for name in args.only or list(OURS):
            times = time_side_by_side(
                make, {"adamw": adamw, "ours": OURS[name], **refs[name]}, args.steps, args.repeats, args.block_s
            )
            ours, base = times.pop("ours"), times.pop("adamw")
            vs_adamw = ours / base
            rows.append([model_name, name, "adamw (torch, foreach)", f"{ours * 1e3:.3f}", f"{base * 1e3:.3f}",
                         f"{vs_adamw:.2f}x"])  # fmt: skip
            if name in ("lion", "adan") and vs_adamw > ADAMW_BOUND:
                missed.append(f"{model_name} {name}: {vs_adamw:.2f}x AdamW")
            for label, ref in times.items():
                rows.append([model_name, name, label, f"{ours * 1e3:.3f}", f"{ref * 1e3:.3f}", f"{ours / ref:.2f}x"])
                if ours > ref:
                    missed.append(f"{model_name} {name}: {ours / ref:.2f}x {label}")
    print(table(["model", "optimizer", "compared with", "ours ms/step", "theirs ms/step", "ours / theirs"], rows))
    print(f"\ntorch {torch.__version__}, {args.threads} thread(s), median of {args.repeats} interleaved blocks")
    if missed:
        print(f"targets missed (<= 1.0x each reference, Lion/Adan <= {ADAMW_BOUND}x AdamW): " + "; ".join(missed))
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
