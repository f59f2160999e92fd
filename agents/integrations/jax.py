"""JAX / Flax: ``trainvigil.jax``. The gradients' health computed inside your jitted step, and checkpoints
of pytrees with the same per-leaf digests as ``trainvigil.checkpoint`` (so ``vigil verify`` and
``vigil checkpoints`` work on them).

Inside the step, :func:`grad_health` returns two device scalars with the step's other outputs: the
global gradient norm (NaN or Inf as soon as any gradient is: ``non_finite`` pages on that step) and
the count of non-finite gradient values (counted only on a step whose norm is not finite). Hand them
to ``agent.log(step, loss=loss, **health)`` as they are: ``log()`` keeps the arrays and the agent's
own thread reads them when it packs the step, so the training loop never waits for the
device (no ``block_until_ready``, no host callback per step). Keep a step's outputs alive only that
long: the agent drops them once packed.

:func:`save` writes a pytree with Flax's msgpack serialization and the manifest beside it (leaf names
from the pytree's key paths, dtype, shape and bytes: the torch scheme); :func:`load` reads it back
into a target structure, checks every leaf against the manifest first, and raises
:class:`~trainvigil.errors.CheckpointIntegrityError` naming the leaves that differ. Both publish the
digest through the current agent, as ``trainvigil.checkpoint`` does.
"""

from __future__ import annotations

import functools
import operator
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from trainvigil.agents import _current
from trainvigil.agents.checkpoint import Verification, digest_record, read_manifest, write_manifest
from trainvigil.agents.digest import StateDigest, digest
from trainvigil.errors import CheckpointIntegrityError

CODEC = "flax-msgpack"


def grad_health(grads: Any) -> dict[str, jax.Array]:
    """``{"grad_norm": ..., "grad_nonfinite": ...}`` of a gradient pytree, for use inside ``jax.jit``.

    The norm is over every floating leaf in float32 (NaN or Inf as soon as any gradient is). The
    non-finite values are counted only when the norm is not finite (``lax.cond``): a finite sum of
    squares means there are none, so a healthy step pays for one reduction a leaf, not two.

    The leaves pass through an ``optimization_barrier`` first, so that XLA cannot merge their
    squares with the optimizer's (Adam squares the same gradients for its second moment): merged,
    the squares had two users and XLA on the CPU wrote them out as a gradient-sized buffer for the
    reduction to read back (``bench/jax_grad_health.py``). Apart, each leaf's squares are summed in
    one fused pass, whatever the optimizer does.
    """
    leaves = [jnp.asarray(g) for g in jax.tree_util.tree_leaves(grads)]
    leaves = [g for g in leaves if jnp.issubdtype(g.dtype, jnp.inexact)]
    if not leaves:
        return {"grad_norm": jnp.float32(0.0), "grad_nonfinite": jnp.float32(0.0)}
    leaves = jax.lax.optimization_barrier(leaves)
    squares = functools.reduce(operator.add, (jnp.sum(jnp.square(g.astype(jnp.float32))) for g in leaves))

    def count() -> jax.Array:
        return functools.reduce(operator.add, (jnp.sum(~jnp.isfinite(g)) for g in leaves)).astype(jnp.float32)

    bad = jax.lax.cond(jnp.isfinite(squares), lambda: jnp.float32(0.0), count)
    return {"grad_norm": jnp.sqrt(squares), "grad_nonfinite": bad}


def _host_state(tree: Any) -> Any:
    """The pytree as nested dicts of NumPy arrays: what Flax writes, and what the digests are over."""
    return jax.tree_util.tree_map(np.asarray, serialization.to_state_dict(jax.device_get(tree)))


def save(tree: Any, path: str | os.PathLike[str], *, step: int | None = None, algo: str = "blake3") -> StateDigest:
    """Write ``tree`` to ``path`` (Flax msgpack) and ``<path>.vigil.json``; publish the digest (origin ``save``)."""
    state = _host_state(tree)
    data = serialization.msgpack_serialize(state)
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "wb") as out:
        out.write(data)
    os.replace(tmp, path)
    d = digest(state, algo)
    write_manifest(path, d, step, codec=CODEC)
    agent = _current.get()
    if agent is not None:
        agent.publish(digest_record(d, os.fspath(path), step, "save"))
    return d


def verify_file(path: str | os.PathLike[str]) -> tuple[Verification, Any]:
    """Check a file :func:`save` wrote against its manifest; returns the verification and the restored state.

    Raises:
        ManifestMissingError: there is no manifest to check against.
    """
    expected, step = read_manifest(path)
    with open(path, "rb") as f:
        state = serialization.msgpack_restore(f.read())
    actual = digest(state, expected.algo)
    return Verification(os.fspath(path), expected, actual, step), state


def load(path: str | os.PathLike[str], target: Any) -> Any:
    """``target``'s structure filled from ``path``, once every leaf matched the manifest.

    Raises:
        CheckpointIntegrityError: the content differs from the manifest (names the leaves).
        ManifestMissingError: no manifest beside the file.
    """
    result, state = verify_file(path)
    agent = _current.get()
    if agent is not None:
        agent.publish(digest_record(result.actual, os.fspath(path), result.step, "load", ok=result.ok))
    if not result.ok:
        raise CheckpointIntegrityError(os.fspath(path), result.differing)
    return serialization.from_state_dict(target, state)
