"""Checkpoint hashing throughput: BLAKE3 vs SHA-256, and which way of using the cores is fastest.

A 2 GB float32 state dict (``--gb``) shaped like a model's: 96 x 16 MiB and 8 x 64 MiB weight
matrices plus 256 small bias vectors; and the same bytes as one single tensor, where per-tensor
parallelism cannot help. Rows:

* ``digest()``: the library call, as ``trainvigil.checkpoint.digest`` runs it (a thread per core
  over tensors, largest first; tensors from 4 MiB one at a time with BLAKE3's own threads,
  smaller ones in the pool);
* ``1 thread``: every tensor hashed in turn on one thread;
* ``pool over tensors``: a thread pool over tensors, each hashed on one thread;
* ``blake3 max_threads per tensor``: tensors in turn, each hashed by BLAKE3 with all cores.

GB/s counts 1e9 bytes of tensor data per second, best of ``--repeat``. Everything runs on CPU
tensors already in memory (no disk).

    python bench/hash_throughput.py        # --gb 2 --repeat 3
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import platform
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import blake3
import torch

from trainvigil.checkpoint import digest

TARGET_GBPS = 4.0


def _state(gb: float) -> dict[str, torch.Tensor]:
    total = int(gb * 2**30)
    big, mid = 64 * 2**20, 16 * 2**20
    state: dict[str, torch.Tensor] = {}
    n_big = max(1, total // 4 // big)
    n_mid = max(1, (total - n_big * big) // mid)
    for i in range(n_big):
        state[f"embed.{i}.weight"] = torch.rand(big // 4)
    for i in range(n_mid):
        state[f"layers.{i}.weight"] = torch.rand(mid // 4)
    for i in range(256):
        state[f"layers.{i}.bias"] = torch.rand(1024)
    return state


def _buffers(state: dict[str, torch.Tensor]) -> list[Any]:
    return sorted((t.reshape(-1).view(torch.uint8).numpy() for t in state.values()), key=lambda b: -b.nbytes)


def _new(algo: str, threads: int = 1) -> Any:
    return blake3.blake3(max_threads=threads) if algo == "blake3" else hashlib.sha256()


def _one(algo: str, buf: Any, threads: int = 1) -> str:
    h = _new(algo, threads)
    h.update(buf)
    return str(h.hexdigest())


def _sequential(algo: str, bufs: list[Any], threads: int) -> None:
    for b in bufs:
        _one(algo, b)


def _pool(algo: str, bufs: list[Any], threads: int) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda b: _one(algo, b), bufs))


def _inner(algo: str, bufs: list[Any], threads: int) -> None:
    for b in bufs:
        _one(algo, b, threads)


def _best(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"{platform.processor() or platform.machine()}, {cores} cores, blake3 {blake3.__version__}")

    state = _state(args.gb)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    single = {"all": torch.cat([t.reshape(-1) for t in state.values()])}
    print(f"state dict: {len(state)} tensors, {nbytes / 1e9:.2f} GB; single tensor: {nbytes / 1e9:.2f} GB\n")

    rows: list[tuple[str, str, str, float]] = []
    for label, sd in [("model-shaped", state), ("one tensor", single)]:
        bufs = _buffers(sd)
        for algo in ("blake3", "sha256"):
            cases: list[tuple[str, Callable[[], Any]]] = [
                ("digest()", functools.partial(digest, sd, algo)),
                ("1 thread", functools.partial(_sequential, algo, bufs, 1)),
                (f"pool over tensors ({cores})", functools.partial(_pool, algo, bufs, cores)),
            ]
            if algo == "blake3":
                cases.append(
                    (f"blake3 max_threads={cores} per tensor", functools.partial(_inner, "blake3", bufs, cores))
                )
            for name, fn in cases:
                rows.append((label, algo, name, nbytes / 1e9 / _best(fn, args.repeat)))

    print(f"| {'state':<12} | {'algo':<6} | {'strategy':<30} | {'GB/s':>6} |")
    print(f"|{'-' * 14}|{'-' * 8}|{'-' * 32}|{'-' * 8}|")
    for label, algo, name, gbps in rows:
        print(f"| {label:<12} | {algo:<6} | {name:<30} | {gbps:6.2f} |")
    lib = next(g for lb, a, n, g in rows if lb == "model-shaped" and a == "blake3" and n == "digest()")
    sha = next(g for lb, a, n, g in rows if lb == "model-shaped" and a == "sha256" and n == "digest()")
    verdict = "met" if lib >= TARGET_GBPS else "MISSED"
    print(f"\ndigest() blake3 / sha256: {lib / sha:.1f}x; target >= {TARGET_GBPS} GB/s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
