"""``trainvigil.jax`` against real JAX, Flax and optax: a jitted step's gradient health logged without a host
sync, a NaN in the gradients paged on its step, and pytree checkpoints that ``vigil verify`` checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import Daemon, NatsServer, wait_for

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

TRAIN = """
import sys, jax, jax.numpy as jnp, optax, flax.linen as nn, trainvigil
from trainvigil import jax as vigil_jax

class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.relu(nn.Dense(32)(x)))

model, key = MLP(), jax.random.PRNGKey(0)
x = jax.random.normal(key, (256, 8))
y = x.sum(1, keepdims=True)
params = model.init(key, x)
opt = optax.adam(1e-2)
opt_state = opt.init(params)

@jax.jit
def train_step(params, opt_state, step):
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
    grads = jax.tree_util.tree_map(lambda g: jnp.where(step == 30, jnp.nan, g), grads)  # the fault, at step 30
    health = vigil_jax.grad_health(grads)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, health

agent = trainvigil.init(run_id="jax-mlp")
for step in range(40):
    if step == 20:
        vigil_jax.save(params, sys.argv[1], step=step)
        params = vigil_jax.load(sys.argv[1], params)
    params, opt_state, loss, health = train_step(params, opt_state, step)
    agent.log(step, loss=loss, **health)  # device arrays: the agent's thread reads them
assert agent.close(timeout=60)
"""


def test_a_nan_in_jitted_gradients_pages_on_its_step_and_pytree_checkpoints_verify(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    d = Daemon(nats_server.url, tmp_path / "data")
    d.start()
    try:
        path = tmp_path / "params.msgpack"
        env = {**os.environ, "VIGIL_NATS_URL": nats_server.url, "PYTHONWARNINGS": "ignore"}
        done = subprocess.run([sys.executable, "-c", TRAIN, str(path)], env=env, capture_output=True, text=True,
                              timeout=180)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        wait_for(lambda: d.scalar("select count(*) from runs where run_id = 'jax-mlp' and status = 'ok'") == 1, 30,
                 "the run ended")  # fmt: skip
        assert d.scalar("select count(grad_norm) from steps where run_id = 'jax-mlp'") == 40
        clean = "select max(grad_norm) < 1e6 and max(extra['grad_nonfinite']) = 0 from steps where step < 30"
        assert d.scalar(clean + " and run_id = 'jax-mlp'")
        assert d.scalar("select extra['grad_nonfinite'] from steps where run_id = 'jax-mlp' and step = 30") > 0
        pages = d.sql("select step, severity from anomalies where run_id = 'jax-mlp' and detector = 'non_finite'")
        assert [tuple(r) for r in pages.rows] == [(30, "page")]
        digests = d.sql("select origin, step, ok from checkpoints where run_id = 'jax-mlp' order by time").rows
        assert [tuple(r) for r in digests] == [("save", 20, True), ("load", 20, True)]

        verify = [sys.executable, "-m", "trainvigil.daemon.cli", "verify", str(path), "--nats", nats_server.url]
        ok = subprocess.run(verify, capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and "OK (" in ok.stdout, ok.stderr
        assert "saved by run jax-mlp rank 0 at step 20" in ok.stdout
        data = bytearray(path.read_bytes())
        data[-8] ^= 0x01  # inside the last array's bytes
        path.write_bytes(bytes(data))
        bad = subprocess.run(verify, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 1 and "MISMATCH" in bad.stdout, bad.stdout + bad.stderr
    finally:
        d.terminate()
