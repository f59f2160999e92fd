"""Step time and CUDA peak memory of trainvigil.optim's optimizers vs AdamW(foreach=True) and their references.

The models, optimizers and references are bench/optim_step.py's (4 x Linear(1024), and 100 x
Linear(32, 32): 200 small tensors). For each optimizer, on a fresh model with fixed random
gradients on the device:

- peak: ``torch.cuda.max_memory_allocated`` over the optimizer's construction and ``--warmup``
  steps, above the parameters' and gradients' own memory: the state plus the step's temporaries;
- state: the bytes of the optimizer's state tensors;
- step time: ``--repeats`` blocks of ``--steps`` steps, each block closed by a device synchronise,
  the median block's time per step.

Optimizers run one after another (a GPU is not shared the way a CPU is), each with AdamW's and
its references' rows beside it. The slowest row is torch.optim.Muon on the 200 small tensors (about
2,500 kernel launches a step); well under two minutes on an H100 is expected with the defaults.

Without CUDA it says so and times the same rows on the CPU (one thread, peak "-"), so the script
can be checked anywhere; ``--require-cuda`` makes that exit 2 instead.

    python bench/optim_cuda.py                  # cuda
    python bench/optim_cuda.py --device cuda:1 --steps 50
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable

import torch
from optim_step import OURS, Factory, Steppable, adamw, models, parameters, references
from tables import table
from torch import nn

MIB = 2**20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def state_bytes(opt: Steppable) -> int:
    tensors = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(
    make_model: Callable[[], nn.Module], factory: Factory, device: torch.device, steps: int, repeats: int, warmup: int
) -> tuple[float, int | None, int]:
    """Seconds per step (median block), the peak above parameters and gradients (CUDA only), state bytes."""
    cuda = device.type == "cuda"
    if cuda:
        gc.collect()  # the last row's optimizer and model, whatever cycles they hold
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    params = parameters(make_model, device)
    _sync(device)
    before = torch.cuda.memory_allocated(device) if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with torch.no_grad():
        opt = factory(params)
        for _ in range(warmup):
            opt.step()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device) - before if cuda else None
        blocks = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(steps):
                opt.step()
            _sync(device)
            blocks.append((time.perf_counter() - started) / steps)
    return statistics.median(blocks), peak, state_bytes(opt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=20, help="steps per block (CPU fallback: 3)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5, help="steps before timing; the peak is read over them")
    parser.add_argument("--only", action="append", choices=sorted(OURS), help="these optimizers (default: all)")
    parser.add_argument("--require-cuda", action="store_true", help="exit 2 when CUDA is absent")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"bench/optim_cuda.py: no CUDA device (torch {torch.__version__}, cuda {torch.version.cuda}, "
              f"{torch.cuda.device_count()} device(s) visible): this benchmark measures the CUDA peak and is meant "
              "for a GPU machine.", file=sys.stderr)  # fmt: skip
        if args.require_cuda:
            return 2
        print("Timing the same rows on the CPU instead (one thread, 3 steps a block, no peak).\n", file=sys.stderr)
        device, args.steps, args.warmup = torch.device("cpu"), min(args.steps, 3), min(args.warmup, 2)
        torch.set_num_threads(1)
    refs = references()
    rows = []
    for model_name, make in models().items():
        base, base_peak, base_state = measure(make, adamw, device, args.steps, args.repeats, args.warmup)
        rows.append([model_name, "adamw (torch, foreach)", f"{base * 1e3:.3f}", "1.00x",
                     "-" if base_peak is None else f"{base_peak / MIB:.1f}", "-" if base_peak is None else "1.00x",
                     f"{base_state / MIB:.1f}"])  # fmt: skip
        for name in args.only or list(OURS):
            rivals = {f"  {name} ref: {label}": factory for label, factory in refs[name].items()}
            for label, factory in {name: OURS[name], **rivals}.items():
                seconds, peak, state = measure(make, factory, device, args.steps, args.repeats, args.warmup)
                rows.append([
                    model_name, label, f"{seconds * 1e3:.3f}", f"{seconds / base:.2f}x",
                    "-" if peak is None else f"{peak / MIB:.1f}", "-" if peak is None or not base_peak else
                    f"{peak / base_peak:.2f}x", f"{state / MIB:.1f}",
                ])  # fmt: skip
    header = ["model", "optimizer", "ms/step", "vs AdamW", "peak MiB", "peak vs AdamW", "state MiB"]
    print(table(header, rows))
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, 1 thread"
    print(f"\ntorch {torch.__version__} on {where}; median of {args.repeats} blocks of {args.steps} steps "
          f"after {args.warmup}; peak above parameters + gradients (construction and warm-up steps)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
