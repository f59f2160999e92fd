"""What ``trainvigil.jax.grad_health`` adds to a jitted training step, measured inside one process.

A Flax MLP with optax (the README's JAX example, ``examples/integrations/jax_mlp.py``) is jitted in
variants that differ only in the gradient health they compute: none, ``grad_health`` as shipped (a sum
of squares per leaf; non-finite values counted only on a step whose norm is not finite), its first
version (a sum of squares and a count of non-finite values per leaf, both every step), and an
alternative tried and not taken (one flat float32 copy of the gradients and one dot: cheaper when XLA
runs on one core, dearer on two, and a copy of every gradient in memory). Each with plain Adam and
with ``optax.clip_by_global_norm`` before it: XLA then computes the sum of squares once for both. Blocks of
``--block`` steps of each variant run in a random order, ``--rounds`` times; each step waits for its
loss so the clock reads whole steps. The ratio is the median over rounds of each block's median step
to the same round's block without health, with a bootstrap 95 % interval. No agent runs: this is the
cost inside the step (``integrations_overhead.py`` times the whole example with the agent).

    python bench/jax_grad_health.py                  # a small and a larger MLP, with and without clipping
    taskset -c 0 python bench/jax_grad_health.py     # XLA on one core
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from _stats import median_interval
from tables import table

from trainvigil.agents.integrations import jax as vigil_jax

SIZES = {"small": (512, 64, 1024), "larger": (1024, 256, 1024)}
"""Name -> (batch, features, hidden) of the MLP ``features -> hidden -> 1``."""
OPTIMIZERS: dict[str, Callable[[], optax.GradientTransformation]] = {
    "adam": lambda: optax.adam(1e-3),
    "clip + adam": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)),
}
"""The optimizers stepped: with global-norm clipping, XLA computes the gradients' sum of squares once for both."""


class MLP(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(1)(nn.relu(nn.Dense(self.hidden)(x)))


def first_version(grads: Any) -> dict[str, jax.Array]:
    """``grad_health`` as it was first written: two reductions per leaf, every step (the reference)."""
    leaves = [g for g in jax.tree_util.tree_leaves(grads) if jnp.issubdtype(g.dtype, jnp.inexact)]
    squares = sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in leaves)
    bad = sum(jnp.sum(~jnp.isfinite(g)) for g in leaves)
    return {"grad_norm": jnp.sqrt(squares), "grad_nonfinite": jnp.asarray(bad, jnp.float32)}


def flat_dot(grads: Any) -> dict[str, jax.Array]:
    """An alternative: one flat float32 copy of the gradients and one dot (the count as ``grad_health``)."""
    leaves = [g for g in jax.tree_util.tree_leaves(grads) if jnp.issubdtype(g.dtype, jnp.inexact)]
    flat = jnp.concatenate([jnp.ravel(g).astype(jnp.float32) for g in leaves])
    squares = jnp.dot(flat, flat, precision=jax.lax.Precision.HIGHEST)

    def count() -> jax.Array:
        return jnp.sum(~jnp.isfinite(flat)).astype(jnp.float32)

    bad = jax.lax.cond(jnp.isfinite(squares), lambda: jnp.float32(0.0), count)
    return {"grad_norm": jnp.sqrt(squares), "grad_nonfinite": bad}


VARIANTS: dict[str, Callable[[Any], dict[str, jax.Array]] | None] = {
    "no health": None,
    "grad_health": vigil_jax.grad_health,
    "first version (2 reductions a leaf)": first_version,
    "alternative: flat copy and a dot": flat_dot,
}


def steps_for(
    batch: int, features: int, hidden: int, optimizer: str
) -> tuple[dict[str, Callable[[], Any]], Callable[[], None]]:
    """One step function per variant over shared parameters, and a reset of the optimizer state."""
    model, key = MLP(hidden), jax.random.PRNGKey(0)
    x = jax.random.normal(key, (batch, features))
    y = x.sum(1, keepdims=True)
    opt = OPTIMIZERS[optimizer]()
    state: dict[str, Any] = {"params": model.init(key, x)}
    state["opt"] = opt.init(state["params"])

    def loss_fn(params: Any) -> jax.Array:
        return jnp.mean((cast(jax.Array, model.apply(params, x)) - y) ** 2)

    def make(health: Callable[[Any], dict[str, jax.Array]] | None) -> Callable[[], Any]:
        @jax.jit
        def train_step(params: Any, opt_state: Any) -> tuple[Any, Any, jax.Array, dict[str, jax.Array]]:
            loss, grads = jax.value_and_grad(loss_fn)(params)
            out = {} if health is None else health(grads)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, out

        def step() -> Any:
            state["params"], state["opt"], loss, _ = train_step(state["params"], state["opt"])
            return loss

        return step

    def reset() -> None:
        state["opt"] = opt.init(state["params"])

    return {name: make(health) for name, health in VARIANTS.items()}, reset


def block(step: Callable[[], Any], n: int) -> float:
    """The median of ``n`` whole steps, in seconds."""
    marks = [time.perf_counter()]
    for _ in range(n):
        step().block_until_ready()
        marks.append(time.perf_counter())
    return statistics.median(b - a for a, b in itertools.pairwise(marks))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="random-order rounds of one block per variant")
    parser.add_argument("--block", type=int, default=200, help="steps per block")
    args = parser.parse_args(argv)
    rng = random.Random(0)
    rows = []
    for (size, (batch, features, hidden)), optimizer in itertools.product(SIZES.items(), OPTIMIZERS):
        steps, reset = steps_for(batch, features, hidden, optimizer)
        for step in steps.values():  # compile and warm each
            block(step, 20)
        times: dict[str, list[float]] = {name: [] for name in steps}
        for r in range(args.rounds):
            order = list(steps)
            rng.shuffle(order)
            for name in order:
                times[name].append(block(steps[name], args.block))
            reset()
            print(f"  {size}, {optimizer}: round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
        base = times["no health"]
        for name, medians in times.items():
            ratios = [m / b for m, b in zip(medians, base, strict=True)]
            low, high = median_interval(ratios)
            rows.append((f"MLP {features}-{hidden}-1, batch {batch}", optimizer, name,
                         f"{1e3 * statistics.median(medians):.3f}", f"{statistics.median(ratios):.3f}x",
                         f"{low:.3f}-{high:.3f}"))  # fmt: skip
    print()
    print(table(("model", "optimizer", "variant", "median step ms", "ratio", "95 % interval"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
