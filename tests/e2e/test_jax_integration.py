"""``trainvigil.jax`` against real JAX, Flax and optax: a jitted step's gradient health logged without a host
sync, a NaN in the gradients paged on its step, and pytree checkpoints that ``vigil verify`` checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from support import Daemon, NatsServer, wait_for

from trainvigil.agents.transport.columnar import _to_floats

if TYPE_CHECKING:  # JAX takes seconds to import and every test process collects every module: tests import it
    import jax
    import optax


@pytest.fixture(autouse=True)
def _jax_flax_optax() -> None:
    """Skips this module's tests without JAX, Flax or optax."""
    for module in ("jax", "flax", "optax"):
        pytest.importorskip(module)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "integrations" / "jax_mlp.py"
"""The docs' JAX example, a whole script."""


@pytest.mark.timeout(100)  # imports JAX and Flax and jit-compiles in a process of its own: ~33 s
def test_a_nan_in_jitted_gradients_pages_on_its_step_and_pytree_checkpoints_verify(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    d = Daemon(nats_server.url, tmp_path / "data")
    d.start()
    try:
        path = tmp_path / "params.msgpack"
        env = {**os.environ, "VIGIL_NATS_URL": nats_server.url, "PYTHONWARNINGS": "ignore"}
        argv = [sys.executable, str(EXAMPLE), str(tmp_path), "--steps", "40", "--save-at", "20", "--nan-at", "30"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
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


def _tree(bad: dict[str, float]) -> dict[str, jax.Array]:
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    tree = {
        "w": rng.normal(size=(64, 32)).astype(np.float32),
        "b": rng.normal(size=32).astype(np.float32),
        "h": rng.normal(size=(8, 8)).astype(np.float32),
    }
    for name, value in bad.items():
        tree[name].reshape(-1)[3] = value
    out = {k: jnp.asarray(v) for k, v in tree.items()}
    out["h"] = out["h"].astype(jnp.bfloat16)
    out["count"] = jnp.arange(5)  # an integer leaf: not a gradient, left out
    return out


def test_grad_health_is_the_float32_global_norm_and_counts_non_finite_values() -> None:
    import jax

    from trainvigil.agents.integrations import jax as vigil_jax

    health = jax.jit(vigil_jax.grad_health)
    clean = _tree({})
    expected = np.sqrt(sum(np.sum(np.square(np.asarray(clean[k], np.float64))) for k in ("w", "b", "h")))
    got = health(clean)
    assert float(got["grad_norm"]) == pytest.approx(expected, rel=1e-5)
    assert float(got["grad_nonfinite"]) == 0.0

    got = health(_tree({"w": np.nan, "b": np.inf}))
    assert np.isnan(float(got["grad_norm"]))
    assert float(got["grad_nonfinite"]) == 2.0
    got = health(_tree({"b": -np.inf}))
    assert float(got["grad_norm"]) == np.inf and float(got["grad_nonfinite"]) == 1.0
    # squares that overflow float32 make the norm Inf, but no gradient value is non-finite
    got = health(_tree({"w": 3e38}))
    assert float(got["grad_norm"]) == np.inf and float(got["grad_nonfinite"]) == 0.0


def test_the_agent_reads_a_column_of_jax_scalars_and_drops_only_what_is_not_one_number() -> None:
    import jax.numpy as jnp

    good = [jnp.float32(1.5), jnp.asarray([2.5]), jnp.asarray(7, jnp.int32), jnp.asarray(True),
            jnp.asarray(0.3, jnp.bfloat16), jnp.float32(np.nan)]  # fmt: skip
    expected = [1.5, 2.5, 7.0, 1.0, float(np.asarray(jnp.asarray(0.3, jnp.bfloat16), np.float64)), np.nan]
    values, present = _to_floats(good)
    assert present is None
    np.testing.assert_array_equal(values, expected)

    values, present = _to_floats([*good, jnp.asarray([1.0, 2.0]), jnp.asarray(1 + 2j)])
    assert present is not None and present.tolist() == [True] * len(good) + [False, False]
    np.testing.assert_array_equal(values[: len(good)], expected)


def _gradient_sized_buffers(health: bool) -> int:
    """Buffers of the largest gradient's shape that XLA writes in an Adam step (the optimized HLO's ops)."""
    import jax
    import jax.numpy as jnp
    import optax

    from trainvigil.agents.integrations import jax as vigil_jax

    params = {"w": jnp.ones((64, 512)), "b": jnp.zeros(512)}
    x = jnp.ones((256, 64))
    opt = optax.adam(1e-3)

    def step(params: dict[str, jax.Array], state: optax.OptState) -> tuple[object, ...]:
        grads = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2))(params)
        out = vigil_jax.grad_health(grads) if health else {}
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, out

    text = jax.jit(step).lower(params, opt.init(params)).compile().as_text() or ""
    entry = text[text.index("ENTRY") :]
    return len(re.findall(r"= f32\[64,512\]\{[\d,]*\} (?!parameter)", entry))


def test_grad_health_makes_xla_write_no_gradient_sized_buffer_beside_adams() -> None:
    # (asked here, not in a skipif: starting JAX's backend while tests collect would put its threads
    # into every later os.fork() of this process, the GIL tests' among them)
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("what XLA fuses differs by backend")
    # Adam squares the same gradients: merged with grad_health's squares, XLA on the CPU wrote them out
    # for the reduction to read back (~2 % of a 6 ms step, bench/jax_grad_health.py); the barrier keeps them apart.
    assert _gradient_sized_buffers(health=True) == _gradient_sized_buffers(health=False)
