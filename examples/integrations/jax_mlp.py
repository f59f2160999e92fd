"""JAX / Flax with trainvigil: a Flax MLP learns a linear function with optax; ``trainvigil.jax.grad_health``
inside the jitted step returns the gradients' global norm and non-finite count, which ``log()`` takes as
device arrays (the agent's thread reads them: the loop never waits on the device); ``save``/``load``
checkpoint the parameters with per-leaf digests that ``vigil verify`` checks.

    vigil up &
    python examples/integrations/jax_mlp.py out/ --steps 40 --save-at 20
    python examples/integrations/jax_mlp.py out/ --nan-at 30    # a NaN in the gradients: non_finite pages at 30
    python examples/integrations/jax_mlp.py out/ --without      # the same training without trainvigil

``tests/e2e/test_jax_integration.py`` runs this script against a real broker and daemon, and
``bench/integrations_overhead.py`` times it with and without trainvigil. The last line printed is the
step times and the seconds the loop took (``_common.py``); to time whole steps, the clock waits for
each step's loss in both arms (``block_until_ready``), which a training loop need not do.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from _common import StepTimes, add_arms, own_agent


class MLP(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(1)(nn.relu(nn.Dense(self.hidden)(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description="a Flax MLP trained with optax, with trainvigil.jax")
    parser.add_argument("out", type=Path, help="folder for the checkpoint")
    add_arms(parser, "jax-mlp")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--save-at", type=int, help="save the parameters at this step, then load them back")
    parser.add_argument("--nan-at", type=int, help="put a NaN into the gradients at this step (a fault to page on)")
    args = parser.parse_args()

    import trainvigil
    from trainvigil import jax as vigil_jax

    agent = own_agent(args) or (None if args.without else trainvigil.init(run_id=args.run_id))
    model, key = MLP(args.hidden), jax.random.PRNGKey(0)
    x = jax.random.normal(key, (args.batch, args.features))
    y = x.sum(1, keepdims=True)
    params = model.init(key, x)
    opt = optax.adam(1e-2)
    opt_state = opt.init(params)

    def loss_fn(params: Any) -> jax.Array:
        return jnp.mean((cast(jax.Array, model.apply(params, x)) - y) ** 2)

    @jax.jit
    def train_step(params: Any, opt_state: Any, step: jax.Array) -> tuple[Any, Any, jax.Array, dict[str, jax.Array]]:
        loss, grads = jax.value_and_grad(loss_fn)(params)
        if args.nan_at is not None:  # the fault, traced in only when asked for
            grads = jax.tree_util.tree_map(lambda g: jnp.where(step == args.nan_at, jnp.nan, g), grads)
        health = {} if args.without else vigil_jax.grad_health(grads)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, health

    times = StepTimes()
    began = time.perf_counter()
    for step in range(args.steps):
        if step == args.save_at:
            path = args.out / "params.msgpack"
            vigil_jax.save(params, path, step=step)
            params = vigil_jax.load(path, params)
        params, opt_state, loss, health = train_step(params, opt_state, step)
        if agent is not None:
            agent.log(step, loss=loss, **health)  # device arrays: the agent's thread reads them
        loss.block_until_ready()  # the clock's, in both arms: it times whole steps
        times.mark()
    seconds = time.perf_counter() - began
    times.report(seconds, agent)


if __name__ == "__main__":
    main()
