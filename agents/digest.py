"""Content digests of state dicts: one per leaf (tensor or plain value) and one root.

A leaf's digest covers its name, dtype, shape and bytes, so a renamed, re-typed or
reshaped tensor changes it as surely as a flipped bit. Leaves are visited in a
deterministic order (mapping keys sorted, sequences by index), so the same content gives
the same root whatever order a dict was built in. Tensors on an accelerator are copied to
host in fixed-size chunks (one chunk buffer per hashing thread, never a second copy of
the tensor). Hashing runs in a thread pool: BLAKE3 and hashlib release the GIL on large
buffers, so threads hash in parallel.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import blake3
import numpy as np

Algo = Literal["blake3", "sha256"]
ALGOS: tuple[str, ...] = ("blake3", "sha256")

CHUNK_BYTES = 64 * 2**20
"""Host staging buffer per hashing thread for accelerator tensors."""

BIG_TENSOR_BYTES = 4 * 2**20
"""With BLAKE3, leaves from this size are hashed one after another, each by BLAKE3's own
threads; smaller ones go to a thread pool. Measured fastest (bench/hash_throughput.py)."""


class _Hasher(Protocol):
    def update(self, data: Any, /) -> Any: ...
    def hexdigest(self) -> str: ...


@dataclass(frozen=True, slots=True)
class StateDigest:
    """Digests of a state dict: ``entries`` maps each leaf's dotted name to its hex digest."""

    algo: str
    root: str
    entries: dict[str, str] = field(default_factory=dict)

    def differing(self, other: StateDigest) -> list[str]:
        """Leaf names whose digests differ, or that only one side has (sorted)."""
        names = set(self.entries) | set(other.entries)
        return sorted(n for n in names if self.entries.get(n) != other.entries.get(n))


def default_threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def new_hasher(algo: str, nbytes: int = 0, threads: int = 1) -> _Hasher:
    if algo == "blake3":
        many = threads > 1 and nbytes >= BIG_TENSOR_BYTES
        return blake3.blake3(max_threads=threads if many else 1)
    if algo == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown digest algorithm {algo!r}; use one of {', '.join(ALGOS)}")


def _sort_key(key: Any) -> tuple[int, Any]:
    if isinstance(key, bool):
        return (2, str(key))
    if isinstance(key, int | float):
        return (0, key)
    return (1, str(key))


def leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted name, leaf) pairs in deterministic order: mappings by sorted key, sequences by index."""
    if isinstance(obj, Mapping):
        for key in sorted(obj, key=_sort_key):
            yield from leaves(obj[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            yield from leaves(item, f"{prefix}.{i}" if prefix else str(i))
    else:
        yield prefix, obj


def _stable_repr(value: Any) -> str:
    """A repr that does not change between processes (no memory addresses)."""
    if value is None or isinstance(value, bool | int | float | complex | str | bytes):
        return repr(value)
    text = repr(value)
    if " at 0x" in text:
        return f"<{type(value).__module__}.{type(value).__qualname__}>"
    return f"{type(value).__module__}.{type(value).__qualname__}:{text}"


def _header(name: str, kind: str, dtype: str, shape: tuple[int, ...]) -> bytes:
    return f"{name}\0{kind}\0{dtype}\0{list(shape)}\0".encode()


def _hash_tensor(name: str, t: Any, algo: str, threads: int) -> str:
    import torch

    t = t.detach()
    if t.is_sparse:
        t = t.to_dense()
    if t.is_quantized:
        t = t.int_repr()
    t = t.resolve_conj().resolve_neg()
    h = new_hasher(algo, t.numel() * t.element_size(), threads)
    h.update(_header(name, "tensor", str(t.dtype), tuple(t.shape)))
    if t.device.type == "meta" or t.numel() == 0:
        return h.hexdigest()
    flat = t.contiguous().reshape(-1).view(torch.uint8)
    if flat.device.type == "cpu":
        h.update(flat.numpy())
        return h.hexdigest()
    size = min(CHUNK_BYTES, flat.numel())
    staging = torch.empty(size, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    for start in range(0, flat.numel(), size):
        part = flat[start : start + size]
        staging[: part.numel()].copy_(part)
        h.update(staging[: part.numel()].numpy())
    return h.hexdigest()


def _hash_leaf(name: str, leaf: Any, algo: str, threads: int) -> str:
    if _is_tensor(leaf):
        return _hash_tensor(name, leaf, algo, threads)
    if isinstance(leaf, np.ndarray):
        h = new_hasher(algo, leaf.nbytes, threads)
        h.update(_header(name, "ndarray", str(leaf.dtype), leaf.shape))
        h.update(np.ascontiguousarray(leaf).view(np.uint8).reshape(-1))
        return h.hexdigest()
    h = new_hasher(algo)
    h.update(_header(name, "value", type(leaf).__qualname__, ()))
    h.update(_stable_repr(leaf).encode())
    return h.hexdigest()


def _is_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _torch() -> Any:
    import sys

    return sys.modules.get("torch")  # a tensor can only exist once torch is imported


def _nbytes(leaf: Any) -> int:
    if _is_tensor(leaf):
        return int(leaf.numel() * leaf.element_size())
    return int(getattr(leaf, "nbytes", 0))


def root_of(algo: str, entries: Mapping[str, str]) -> str:
    """The root digest over ``entries`` in their (deterministic) order."""
    h = new_hasher(algo)
    h.update(f"trainvigil-state-digest-v1\0{algo}\n".encode())
    for name, hexdigest in entries.items():
        h.update(f"{name}\0{hexdigest}\n".encode())
    return h.hexdigest()


def digest(state: Any, algo: str = "blake3", *, threads: int | None = None) -> StateDigest:
    """Digest every leaf of ``state`` (a state dict, optimizer state, nested dicts/lists).

    Args:
        state: tensors on any device, NumPy arrays and plain values, nested in
            mappings, lists and tuples.
        algo: ``"blake3"`` (default) or ``"sha256"``.
        threads: hashing threads (default: the CPU count, at most 8).

    Returns:
        A :class:`StateDigest` with one hex digest per leaf and the root over all of them.
    """
    new_hasher(algo)  # reject an unknown algorithm before any work
    threads = threads or default_threads()
    items = list(leaves(state))
    names = [name for name, _ in items]
    if len(names) != len(set(names)):
        dup = sorted({n for n in names if names.count(n) > 1})[:5]
        raise ValueError(f"state has leaves with the same dotted name {dup}; rename keys that contain '.'")
    # Largest first, so one big tensor does not start last and finish alone.
    order = sorted(range(len(items)), key=lambda i: -_nbytes(items[i][1]))
    results: list[str] = [""] * len(items)
    if threads == 1 or len(items) <= 1:
        for i in order:
            results[i] = _hash_leaf(items[i][0], items[i][1], algo, threads)
    else:
        # BLAKE3 splits one buffer across threads itself: big leaves go one at a time with all
        # threads; the pool takes the rest (and every leaf for SHA-256, which is single-threaded).
        inner = [i for i in order if algo == "blake3" and _nbytes(items[i][1]) >= BIG_TENSOR_BYTES]
        big = set(inner)
        pooled = [i for i in order if i not in big]
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="trainvigil-hash") as pool:
            futures = {i: pool.submit(_hash_leaf, items[i][0], items[i][1], algo, 1) for i in pooled}
            for i in inner:
                results[i] = _hash_leaf(items[i][0], items[i][1], algo, threads)
            for i, fut in futures.items():
                results[i] = fut.result()
    entries = dict(zip(names, results, strict=True))
    return StateDigest(algo=algo, root=root_of(algo, entries), entries=entries)


__all__ = ["ALGOS", "Algo", "StateDigest", "digest", "leaves", "root_of"]
