"""What ``trainvigil.jax.grad_health`` adds to a jitted training step, measured inside one process.

A Flax MLP with optax (the docs' JAX example, ``examples/integrations/jax_mlp.py``) is jitted in
variants that differ only in the gradient health they compute: none; ``grad_health`` as shipped (the
leaves through an ``optimization_barrier``, then a sum of squares per leaf; non-finite values counted
only on a step whose norm is not finite); its previous version (the same without the barrier: XLA
merged its squares with Adam's and, on the CPU, wrote them out as a gradient-sized buffer); and its
first version (a sum of squares and a count of non-finite values per leaf, both every step). Each with
plain Adam and with ``optax.clip_by_global_norm`` before it. A round runs every variant once in a random
order, each block beside one of the variant without health (before it or after, in turn), ``--rounds``
times; each step waits for its loss so the clock reads whole steps. A block is ``--lead`` seconds of
untimed steps and then ``--seconds`` of timed ones (as steps, from the warm-up's step time), so a block
with an agent spans two of its flush intervals at least. The ratio is the median over rounds of each
block's mean step to that of the block without health beside it, with a bootstrap 95 % interval. This
machine's step drifts by a few per cent over tens of seconds, about what a round of seven variants
lasts: compared with its round's one block without health instead, two runs of the same command
differed by ~1 %. The ratio of the blocks' median steps is printed beside it. Judge by
the mean: the agent's thread packs and publishes once per flush interval, and the few steps that pay for
it are what a median leaves out. The health variants run with no agent: theirs is the cost inside the step.

``--agent`` adds the whole integration, side by side in the same process: a real nats-server and daemon
start pinned to the machine's last core, and two more variants log every step through an agent that
is started (connected, settled) before each of their blocks and closed after it: the loss alone, and
the loss with ``grad_health``'s two device scalars (the docs' example). Between fresh processes a
step moves about 5 % (``integrations_overhead.py``); between blocks of one process, about 1 %.
``--agent-cpu N`` moves the agent's thread onto CPU ``N`` (the training stays where it is): what the
agent costs when its thread does not share the training's core, as on a machine with a core to spare.

On a machine of two cores the services' own work (the daemon ingesting, DuckDB committing) sits on the
other core and still slows the training's through the shared cache and memory: a process that streams
memory 10 % of the time on CPU 1 slowed this step on CPU 0 by ~4 %, a spinning one not at all. So
``--agent`` also runs the step without health while another process, on the services' CPU, logs the
same three values at the training's step rate through its own agent ("... from a process beside the
services"): the services then do the work the agent variants give them, and the agent variants'
difference from it is what the agent costs inside the training process.

The last column is the process's minor page faults per timed step (the median over a variant's blocks).
XLA on the CPU takes its buffers from glibc's heap. While an agent holds a second's worth of a step's
device scalars, and then frees them all at once, that heap can shrink and fault its memory back in on every
step. Scratch probes measured 20-50 faults a step this way, none when the scalars lived 32 steps at most, and
none with glibc's trimming and mmap thresholds fixed. Fixed thresholds apply to both arms of a pair:
``GLIBC_TUNABLES=glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=1073741824``.

    python bench/jax_grad_health.py                  # a small and a larger MLP, with and without clipping
    taskset -c 0 python bench/jax_grad_health.py     # XLA on one core
    taskset -c 0 python bench/jax_grad_health.py --agent --size larger --optimizer adam   # the whole example's cost
    taskset -c 0 python bench/jax_grad_health.py --agent --agent-cpu 1 --size larger --optimizer adam
    taskset -c 0 python bench/jax_grad_health.py --agent --size larger --optimizer adam \
        --only 'grad_health, logged' --only beside --rounds 40      # the whole integration, more pairs
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from _procs import pin_agent_thread, start_services
from _stats import median_interval, step_times
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


def previous_version(grads: Any) -> dict[str, jax.Array]:
    """``grad_health`` before the barrier: its squares are the optimizer's, merged by XLA (the reference)."""
    leaves = [g for g in jax.tree_util.tree_leaves(grads) if jnp.issubdtype(g.dtype, jnp.inexact)]
    squares = sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in leaves)

    def count() -> jax.Array:
        return jnp.asarray(sum(jnp.sum(~jnp.isfinite(g)) for g in leaves), jnp.float32)

    bad = jax.lax.cond(jnp.isfinite(squares), lambda: jnp.float32(0.0), count)
    return {"grad_norm": jnp.sqrt(squares), "grad_nonfinite": bad}


BASE = "no health"
"""The variant every other one is compared with: each of their blocks runs beside one of its."""
VARIANTS: dict[str, Callable[[Any], dict[str, jax.Array]] | None] = {
    BASE: None,
    "grad_health": vigil_jax.grad_health,
    "previous version (no barrier)": previous_version,
    "first version (2 reductions a leaf)": first_version,
}
LOGGED = {"loss, logged by an agent": BASE, "grad_health, logged by an agent": "grad_health"}
"""``--agent``'s variants: name -> the variant whose step they run, with an agent logging its outputs."""
BESIDE = "no health; the same logging from a process beside the services"
"""``--agent``'s control: the step without health while another process gives the services the same load."""
_BESIDE_LOGGER = """
import os, sys, time
import trainvigil
os.sched_setaffinity(0, {int(sys.argv[1])})
period = float(sys.argv[2])
agent = trainvigil.init(run_id=sys.argv[3])
agent.flush(10)
print("ready", flush=True)
step, due = 0, time.perf_counter()
while True:
    agent.log(step, loss=1.0 / (step + 1), grad_norm=0.5, grad_nonfinite=0.0)
    step, due = step + 1, due + period
    time.sleep(max(0.0, due - time.perf_counter()))
"""


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

        def step() -> tuple[jax.Array, dict[str, jax.Array]]:
            state["params"], state["opt"], loss, health = train_step(state["params"], state["opt"])
            return loss, health

        return step

    def reset() -> None:
        state["opt"] = opt.init(state["params"])

    return {name: make(health) for name, health in VARIANTS.items()}, reset


Block = tuple[float, float, float]
"""A block's mean and median step in seconds, and the process's minor page faults a timed step."""


def block(step: Callable[[], Any], n: int, agent: Any = None, lead: int = 0) -> Block:
    """``n`` whole steps after ``lead`` untimed ones (see :data:`Block`); with ``agent``, each step's outputs
    logged (device arrays)."""
    marks = [time.perf_counter()]
    faults = 0
    for i in range(lead + n):
        if i == lead:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        loss, health = step()
        if agent is not None:
            agent.log(i, loss=loss, **health)
        loss.block_until_ready()
        marks.append(time.perf_counter())
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return (*step_times(marks, lead), faults / n)


@contextlib.contextmanager
def logging_agent(run_id: str, settle: float, cpu: int | None = None) -> Iterator[Any]:
    """An agent connected and settled before the block (its start-up is not the step's), closed after;
    with ``cpu``, its thread moved onto that CPU."""
    import trainvigil

    agent = trainvigil.init(run_id=run_id)
    try:
        if cpu is not None:
            pin_agent_thread(cpu)
        agent.flush(10)
        time.sleep(settle)
        yield agent
    finally:
        agent.close()


@contextlib.contextmanager
def logging_beside(run_id: str, cpu: int, period: float, settle: float) -> Iterator[None]:
    """Another process on ``cpu`` (the services') logging three floats every ``period`` seconds through an agent."""
    command = [sys.executable, "-c", _BESIDE_LOGGER, str(cpu), str(period), run_id]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "the logger did not start"
            time.sleep(settle)
            yield
        finally:
            proc.kill()


@contextlib.contextmanager
def services(wanted: bool) -> Iterator[int | None]:
    """With ``wanted``: nats-server and the daemon on the machine's last core (yielded), the agent's URL set;
    stopped after."""
    if not wanted:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="bench-jax-") as name, contextlib.ExitStack() as stack:
        svc = start_services(stack, Path(name))
        last = (os.cpu_count() or 1) - 1
        svc.pin(last)
        os.environ.update(VIGIL_NATS_URL=svc.url, VIGIL_LOG_LEVEL="warning")
        print(f"  nats-server and the daemon on cpu {last}; the training on cpus {sorted(os.sched_getaffinity(0))}")
        yield last


def model_rows(
    args: argparse.Namespace, size: str, optimizer: str, services_cpu: int | None, rng: random.Random
) -> list[tuple[str, ...]]:
    """The table's rows for one model and optimizer: every variant against the blocks without health beside it."""
    batch, features, hidden = SIZES[size]
    steps, reset = steps_for(batch, features, hidden, optimizer)
    warm = {name: block(step, 20)[1] for name, step in steps.items()}  # compile and warm each
    period = warm[BASE]  # the step the control logs at the rate of
    n, lead = max(20, round(args.seconds / period)), round(args.lead / period)

    def run(name: str, r: int) -> Block:
        if name in LOGGED:
            run_id = f"jax-grad-health-{os.getpid()}-{size}-{r}-{list(LOGGED).index(name)}"  # a run per block
            with logging_agent(run_id, args.settle, args.agent_cpu) as agent:
                return block(steps[LOGGED[name]], n, agent, lead)
        if name == BESIDE and services_cpu is not None:
            with logging_beside(f"jax-beside-{os.getpid()}-{size}-{r}", services_cpu, period, args.settle):
                return block(steps[BASE], n, lead=lead)
        return block(steps[name], n, lead=lead)

    names = [name for name in (*steps, *((*LOGGED, BESIDE) if args.agent else ())) if name != BASE]
    chosen = [name for name in names if not args.only or any(part in name for part in args.only)]
    if not chosen:
        raise SystemExit(f"--only {args.only} matches none of the variants: {', '.join(names)}")
    names = chosen
    pairs: dict[str, list[tuple[Block, Block]]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = list(names)
        rng.shuffle(order)
        for k, name in enumerate(order):  # each block beside one without health, before it or after in turn
            if (r + k) % 2:
                pairs[name].append((run(name, r), run(BASE, r)))
            else:
                base = run(BASE, r)
                pairs[name].append((run(name, r), base))
        reset()
        print(f"  {size}, {optimizer}: round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
    model = f"MLP {features}-{hidden}-1, batch {batch}"
    bases = [b for blocks in pairs.values() for _, b in blocks]
    base_cells = (f"{1e3 * statistics.median(b[0] for b in bases):.3f}", "1.000x",
                  f"{1e3 * statistics.median(b[1] for b in bases):.3f}", "1.000x",
                  f"{statistics.median(b[2] for b in bases):.1f}")  # fmt: skip
    rows: list[tuple[str, ...]] = [(model, optimizer, BASE, *base_cells)]
    for name, blocks in pairs.items():
        cells = []
        for k in (0, 1):  # the blocks' means, then their medians
            ratios = [m[k] / b[k] for m, b in blocks]
            low, high = median_interval(ratios)
            cells += [f"{1e3 * statistics.median(m[k] for m, _ in blocks):.3f}",
                      f"{statistics.median(ratios):.3f}x ({low:.3f}-{high:.3f})"]  # fmt: skip
        cells.append(f"{statistics.median(m[2] for m, _ in blocks):.1f}")
        rows.append((model, optimizer, name, *cells))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=12,
        help="rounds of every variant once, in a random order, each beside a block without health",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=2.5,
        help="timed seconds per block (in steps, from the warm-up): two flush intervals at least",
    )
    parser.add_argument("--lead", type=float, default=0.3, help="untimed seconds at a block's start")
    parser.add_argument("--agent", action="store_true", help="add the variants logged by an agent (starts services)")
    parser.add_argument("--settle", type=float, default=0.3, help="seconds between an agent's start and its block")
    parser.add_argument("--agent-cpu", type=int, help="with --agent: the agent thread's CPU (default: the training's)")
    parser.add_argument("--size", action="append", choices=SIZES, help="a model to run (repeatable; default all)")
    parser.add_argument("--optimizer", action="append", choices=OPTIMIZERS, help="(repeatable; default all)")
    parser.add_argument(
        "--only",
        action="append",
        metavar="TEXT",
        help="run only the variants whose name holds TEXT, each beside its block without health (repeatable; "
        "e.g. --only 'grad_health, logged' --only beside, with --agent)",
    )
    args = parser.parse_args(argv)
    rng = random.Random(0)
    rows = []
    with services(args.agent) as services_cpu:
        for size, optimizer in itertools.product(args.size or SIZES, args.optimizer or OPTIMIZERS):
            rows += model_rows(args, size, optimizer, services_cpu, rng)
    print()
    header = ("model", "optimizer", "variant", "mean step ms", "ratio (95 % interval)", "median step ms",
              "ratio of medians", "page faults a step")  # fmt: skip
    print(table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
