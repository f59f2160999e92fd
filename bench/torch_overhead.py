"""What ``trainvigil.torch.watch`` costs a real training step, side by side with the same run without it.

The step: a 4 x Linear(1024) MLP (ReLU between), batch ``--batch``, MSE loss, backward, AdamW, on
CPU (or ``--device cuda``). Every variant runs the same loop on the same model and optimizer and
logs ``loss`` (and the clip norm when it clips) through a real agent publishing to a real
nats-server, so the only difference between rows is watch() and clipping:

* ``clip``: ``clip_grad_norm_`` + the user logs its norm; no watch (the baseline of the next two)
* ``clip + watch(grad_norm=False)``: the norm is shared with clipping; watch adds lr and step time
* ``clip + watch()``: watch computes its own fused norm on top of clipping
* ``plain``: no clipping, no watch (the baseline of the next row)
* ``plain + watch()``: the fused norm (and lr, step time) without clipping

Variants are interleaved in rounds, in a fresh random order each round, so drift and other load
on the machine hit them alike; each row reports the median step time over all its steps and its
overhead against its baseline, paired per round (the median over rounds of the ratio of round
medians). A last table times, against the ``plain`` step, the fused norm alone (``_foreach_norm``
+ one norm over the per-parameter norms), ``clip_grad_norm_`` alone, and watch()'s two hooks
called directly (their whole per-step work, logging included), and the pre hook (the norm) alone.

    python bench/torch_overhead.py                 # --rounds 30 --steps 20 --batch 128
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import trainvigil
from trainvigil.daemon.broker.embedded import find_binary, free_port, port_open, server_args
from trainvigil.torch import Watch, watch


def _mlp(device: str) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for i in range(4):
        layers.append(torch.nn.Linear(1024, 1024))
        if i < 3:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(device)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


async def _make_stream(url: str) -> None:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="VIGIL", subjects=["vigil.v1.>"])
    await nc.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant per round")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device

    tmp = Path(tempfile.mkdtemp(prefix="vigil-bench-"))
    port = free_port()
    server = subprocess.Popen(
        server_args(find_binary(), port, tmp / "js"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while not port_open("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.05)
        url = f"nats://127.0.0.1:{port}"
        asyncio.run(_make_stream(url))
        agent = trainvigil.init(run_id="bench-torch", rank=0, nats_url=url)
        report(agent, device, args)
        ok = agent.close(timeout=30)
        print(f"\nagent delivered everything: {ok}; stats: {agent.stats()}")
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(agent: trainvigil.Agent, device: str, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = _mlp(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, 1024, device=device)
    y = torch.randn(args.batch, 1024, device=device)
    step_no = [0]

    def step(clip: bool) -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        metrics: dict[str, Any] = {"loss": loss.detach()}
        if clip:
            metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        agent.log(step_no[0], **metrics)
        step_no[0] += 1

    variants: list[tuple[str, bool, dict[str, Any] | None, str]] = [
        ("clip", True, None, "clip"),
        ("clip + watch(grad_norm=False)", True, {"grad_norm": False}, "clip"),
        ("clip + watch()", True, {}, "clip"),
        ("plain", False, None, "plain"),
        ("plain + watch()", False, {}, "plain"),
    ]
    times: dict[str, list[float]] = {v[0]: [] for v in variants}
    round_medians: dict[str, list[float]] = {v[0]: [] for v in variants}
    for _ in range(5):  # warm-up: allocator, AdamW state, threads
        step(True)
    rng = np.random.default_rng(0)
    for _ in range(args.rounds):
        for v in rng.permutation(len(variants)):  # a fresh order each round: no variant always runs first
            name, clip, kwargs, _base = variants[v]
            w = None
            if kwargs is not None:
                w = watch(model, opt, agent, start_step=step_no[0], **kwargs)
            step(clip)  # one unmeasured step after (un)hooking
            mine = []
            for _ in range(args.steps):
                _sync(device)
                t0 = time.perf_counter()
                step(clip)
                _sync(device)
                mine.append(time.perf_counter() - t0)
            times[name].extend(mine)
            round_medians[name].append(float(np.median(mine)))
            if w is not None:
                w.remove()

    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, cpus {os.cpu_count()}")
    print(f"4 x Linear(1024) MLP, batch {args.batch}, AdamW; {args.rounds} rounds x {args.steps} steps per variant\n")
    medians = {k: float(np.median(v)) for k, v in times.items()}
    print(f"| {'variant':<30} | {'median ms':>9} | {'p25 ms':>7} | {'p90 ms':>7} | {'vs baseline':>11} |")
    print(f"|{'-' * 32}|{'-' * 11}|{'-' * 9}|{'-' * 9}|{'-' * 13}|")
    for name, _clip, kwargs, base in variants:
        v = np.asarray(times[name])
        # Paired per round (same load on the machine), then the median over rounds.
        paired = np.asarray(round_medians[name]) / np.asarray(round_medians[base])
        rel = "baseline" if kwargs is None else f"{(float(np.median(paired)) - 1) * 100:+.2f}%"
        p25, p90 = np.percentile(v, 25) * 1e3, np.percentile(v, 90) * 1e3
        print(f"| {name:<30} | {medians[name] * 1e3:9.3f} | {p25:7.3f} | {p90:7.3f} | {rel:>11} |")

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    fused = _time(lambda: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))), device)
    clip_alone = _time(lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9), device)
    rows = [("fused norm (_foreach_norm + 1)", fused), ("clip_grad_norm_", clip_alone)]
    for label, kwargs in [("watch hooks, grad_norm=False", {"grad_norm": False}), ("watch hooks, grad_norm=True", {})]:
        # The hooks' own work per step (pre + post, logging included), called directly.
        w = watch(model, opt, agent, start_step=step_no[0], **kwargs)

        def hooks(w: Watch = w) -> None:
            w._pre(opt, (), {})
            w._post(opt, (), {})

        rows.append((label, _time(hooks, device)))
        if w.grad_norm:  # the split: the pre hook takes the norm; the post hook copies it out, marks the step

            def pre(w: Watch = w) -> None:
                w._pre(opt, (), {})

            rows.append(("  of which the pre hook", _time(pre, device)))
        step_no[0] = w.step
        w.remove()
    print(f"\n| {'operation alone':<30} | {'median ms':>9} | {'of plain step':>13} |")
    print(f"|{'-' * 32}|{'-' * 11}|{'-' * 15}|")
    for name, t in rows:
        print(f"| {name:<30} | {t * 1e3:9.3f} | {t / medians['plain'] * 100:12.2f}% |")


def _time(fn: Callable[[], Any], device: str, n: int = 200) -> float:
    for _ in range(10):
        fn()
    out = []
    for _ in range(n):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


if __name__ == "__main__":
    sys.exit(main())
