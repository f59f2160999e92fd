"""Step time of trainvigil.optim's optimizers vs their reference implementations and vs AdamW(foreach=True).

Two models: a 4 x Linear(1024) MLP (4.2 M parameters in 8 tensors) and 100 x Linear(32, 32)
(200 small tensors, where per-tensor overhead dominates). Gradients are fixed random tensors set
once, so only ``optimizer.step()`` is timed: ``--repeats`` blocks of ``--steps`` steps after a
warm-up, the median block's time per step. One intra-op thread unless ``--threads``.

References: ``lion-pytorch`` (Lion), ``pytorch-optimizer``'s ``Adan(foreach=True)``, ``SophiaH(foreach=True)``
(the same clipped step as Sophia-G; its Hessian estimate given once, not refreshed while timed)
and ``Muon`` (its own Newton-Schulz, AdamW on the rest). trainvigil's Muon *is* torch.optim.Muon +
AdamW, so its reference row compares two implementations of the same algorithm. A reference that
is not installed gets "-".

    python bench/optim_step.py            # --steps 50 --repeats 5 (Muon: --slow-steps 3)
    python bench/optim_step.py --check    # exit 1 unless Lion and Adan are <= 1.0x reference, <= 1.3x AdamW
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from tables import table
from torch import nn

from trainvigil.optim import Adan, Lion, Muon, SophiaG

Factory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
LR, WD = 1e-3, 0.01


def models() -> dict[str, Callable[[], nn.Module]]:
    return {
        "mlp 4x1024": lambda: nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(4))),
        "200 small": lambda: nn.Sequential(*(nn.Linear(32, 32) for _ in range(100))),
    }


def _references() -> dict[str, Factory | None]:
    refs: dict[str, Factory | None] = dict.fromkeys(("lion", "adan", "sophia", "muon"))
    try:
        from lion_pytorch import Lion as RefLion

        refs["lion"] = lambda p: RefLion(p, lr=LR, weight_decay=WD)
    except ImportError:
        pass
    try:
        import pytorch_optimizer as po
    except ImportError:
        return refs
    refs["adan"] = lambda p: po.Adan(p, lr=LR, weight_decay=WD, weight_decouple=True, foreach=True)

    def sophia(p: list[nn.Parameter]) -> torch.optim.Optimizer:
        opt = po.SophiaH(p, lr=LR, weight_decay=WD, update_period=10**9, foreach=True)
        opt.step(hessian=[torch.rand_like(q) for q in p])  # the estimate once, outside the timing
        return opt

    def muon(p: list[nn.Parameter]) -> torch.optim.Optimizer:
        groups = [
            {"params": [q for q in p if q.ndim == 2], "use_muon": True},
            {"params": [q for q in p if q.ndim != 2], "use_muon": False},
        ]
        return po.Muon(groups, lr=0.02, weight_decay=WD, adamw_lr=LR, adamw_wd=WD)

    refs["sophia"], refs["muon"] = sophia, muon
    return refs


def _sophia(p: list[nn.Parameter]) -> torch.optim.Optimizer:
    opt = SophiaG(p, lr=LR, weight_decay=WD, update_every=10**9)
    opt.fold_hessian(p, [torch.rand_like(q) for q in p])
    return opt


OURS: dict[str, Factory] = {
    "lion": lambda p: Lion(p, lr=LR, weight_decay=WD),
    "adan": lambda p: Adan(p, lr=LR, weight_decay=WD),
    "sophia": _sophia,
    "muon": lambda p: Muon(p, lr=0.02, weight_decay=WD, adamw_lr=LR),
}


def time_step(make_model: Callable[[], nn.Module], factory: Factory, steps: int, repeats: int) -> float:
    """Median seconds per ``step()`` over ``repeats`` blocks of ``steps``, after a warm-up block."""
    torch.manual_seed(0)
    model = make_model()
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    opt = factory(params)
    with torch.no_grad():
        for _ in range(max(1, steps // 5)):
            opt.step()
        blocks = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(steps):
                opt.step()
            blocks.append((time.perf_counter() - started) / steps)
    return statistics.median(blocks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slow-steps", type=int, default=3, help="steps per block for Muon (seconds a step on CPU)")
    parser.add_argument("--check", action="store_true", help="exit 1 unless the Lion/Adan targets hold")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    refs = _references()
    rows, missed = [], []
    for model_name, make in models().items():
        adamw = time_step(make, lambda p: torch.optim.AdamW(p, lr=LR, weight_decay=WD, foreach=True), args.steps,
                          args.repeats)  # fmt: skip
        rows.append([model_name, "adamw (torch, foreach)", f"{adamw * 1e3:.3f}", "-", "-", "1.00x"])
        for name, factory in OURS.items():
            steps = args.slow_steps if name == "muon" else args.steps
            ours = time_step(make, factory, steps, args.repeats)
            ref_factory = refs[name]
            ref = time_step(make, ref_factory, steps, args.repeats) if ref_factory is not None else None
            vs_ref = ours / ref if ref else None
            vs_adamw = ours / adamw
            rows.append([
                model_name, name, f"{ours * 1e3:.3f}", "-" if ref is None else f"{ref * 1e3:.3f}",
                "-" if vs_ref is None else f"{vs_ref:.2f}x", f"{vs_adamw:.2f}x",
            ])  # fmt: skip
            if name in ("lion", "adan") and ((vs_ref is not None and vs_ref > 1.0) or vs_adamw > 1.3):
                missed.append(f"{model_name} {name}: {vs_ref and round(vs_ref, 2)}x reference, {vs_adamw:.2f}x AdamW")
    print(table(["model", "optimizer", "ours ms/step", "reference ms/step", "vs reference", "vs AdamW"], rows))
    print(f"\ntorch {torch.__version__}, {args.threads} thread(s), median of {args.repeats} x {args.steps} steps")
    if missed:
        print("targets missed (Lion/Adan: <= 1.0x reference, <= 1.3x AdamW): " + "; ".join(missed))
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
