"""What each framework integration adds to its framework's own step time, side by side in one run.

For each framework (transformers ``Trainer``, Lightning, Stable-Baselines3, JAX, Ray Train) the docs'
example script (``examples/integrations/``) trains the same small model the same steps without the
integration (``--without``: for Lightning, its default logger in place of ours) and with it
(``--init-first``), alternately (``--repeats`` pairs in fresh processes, every other pair in the
other order), against a real nats-server and daemon. The agent is started with ``trainvigil.init()``
and has reached the broker before training starts, so its start-up is not counted (the integration
logs through it, as it does in a script that starts its own agent). The ratio is the median over the
pairs of each pair's ratio of mean step times (each script marks its framework's step ends with the
same hook in both arms: ``examples/integrations/_common.py``); the mean, not the median, because the
agent's thread packs and publishes once per flush interval and the few steps that pay for it are what a
median leaves out. The ratio of median steps, and the ratio of whole training calls
(``Trainer.train``'s ``train_runtime``; ``Trainer.fit``, ``PPO.learn``, the JAX loop and rank 0's Ray
Train loop timed around the call), are printed beside it. nats-server and the daemon run on the machine's
last core and the training on the others (``--shared`` leaves them together): on a 2-core machine the
daemon ingesting the 'with' run took CPU from the training and its cost read as the integration's; a
daemon is a sidecar with a core of its own.
Beside the ratio: a bootstrap 95 % interval of its median (a run's step time moves a few per cent
between processes, so a 1 % effect needs many pairs to show), and the CPU the agent's thread used over
the "with" run's training (it runs on the training's cores), which the ratio cannot resolve alone.
Target: <= 1.01.

    python bench/integrations_overhead.py                 # --repeats 5
    python bench/integrations_overhead.py --only sb3
    python bench/integrations_overhead.py --shared        # the daemon on the training's cores too
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from _procs import start_services
from _stats import median_interval
from tables import table

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "integrations"
COMMANDS = {
    "transformers": ["hf_trainer.py", "{tmp}", "--steps", "200", "--layers", "2", "--width", "64", "--length", "64",
                     "--batch", "8", "--log-every", "10"],
    "lightning": ["lightning_regression.py", "{tmp}", "--epochs", "1", "--batches", "3072", "--batch", "32",
                  "--features", "64", "--hidden", "256", "--log-every", "10", "--clip", "0"],
    "sb3": ["sb3_ppo.py", "--timesteps", "8192", "--rollout", "512"],
    "jax": ["jax_mlp.py", "{tmp}", "--steps", "2000", "--batch", "1024", "--features", "256", "--hidden", "1024"],
    "ray": ["ray_train.py", "{tmp}", "--workers", "2", "--steps", "2000", "--batch", "64", "--features", "32",
            "--hidden", "128"],
}  # fmt: skip
"""The documented example scripts (``examples/integrations/``), at sizes where a step is the framework's work."""
WORK = {
    "transformers": "200 steps, GPT-2 2x64",
    "lightning": "3072 steps, MLP 64-256-1",
    "sb3": "PPO CartPole 8192 env steps",
    "jax": "2000 steps, Flax MLP 256-1024-1",
    "ray": "2000 steps x 2 workers, DDP MLP 32-128-1",
}


def timed(framework: str, mode: str, run_id: str, tmp: Path, url: str) -> dict[str, float]:
    """One run's step times and seconds, as the script prints them last (``examples/integrations/_common.py``)."""
    env = {**os.environ, "VIGIL_NATS_URL": url, "PYTHONWARNINGS": "ignore", "RAY_AUTH_MODE": "disabled"}
    script, *args = COMMANDS[framework]
    arm = ["--without"] if mode == "without" else ["--init-first", "--run-id", run_id]
    argv = [sys.executable, str(EXAMPLES / script), *(a.format(tmp=tmp) for a in args), *arm]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="pairs of runs per framework")
    parser.add_argument("--only", choices=sorted(COMMANDS), action="append", help="one framework (repeatable)")
    parser.add_argument("--shared", action="store_true",
                        help="leave nats-server and the daemon on the training's cores (by default they get the last "
                        "core and training the others: on a small machine the daemon's work for the 'with' run "
                        "would otherwise count as the integration's)")  # fmt: skip
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-integrations-") as name, contextlib.ExitStack() as stack:
        tmp = Path(name)
        svc = start_services(stack, tmp)
        cpus = sorted(os.sched_getaffinity(0))
        if not args.shared and len(cpus) > 1:
            svc.pin(cpus[-1])
            os.sched_setaffinity(0, set(cpus[:-1]))  # the training processes inherit it
            print(f"  training on cpus {cpus[:-1]}, nats-server and the daemon on cpu {cpus[-1]}", flush=True)
        for framework in args.only or list(COMMANDS):
            step_ratios, median_ratios, total_ratios, steps, agent_shares = [], [], [], [], []
            for k in range(args.repeats):
                # ABBA: every other pair runs "with" first, so an order effect (a warmer GPU or cache, a
                # daemon still busy with the last run) falls on both arms alike.
                order = ("without", "with") if k % 2 == 0 else ("with", "without")
                runs = {mode: timed(framework, mode, f"bench-{framework}-{k}", tmp, svc.url) for mode in order}
                without, with_ = runs["without"], runs["with"]
                step_ratios.append(with_["mean_step_ms"] / without["mean_step_ms"])
                median_ratios.append(with_["median_step_ms"] / without["median_step_ms"])
                total_ratios.append(with_["seconds"] / without["seconds"])
                steps.append((without["mean_step_ms"], with_["mean_step_ms"]))
                if with_.get("agent_cpu_s") is not None:
                    agent_shares.append(with_["agent_cpu_s"] / with_["seconds"])
                print(f"  {framework} pair {k + 1}: mean step {steps[-1][0]:.3f} ms without, {steps[-1][1]:.3f} ms"
                      f" with ({step_ratios[-1]:.3f}x); whole run {without['seconds']:.2f} s, {with_['seconds']:.2f} s"
                      f" ({total_ratios[-1]:.3f}x)", flush=True)  # fmt: skip
            ratio = statistics.median(step_ratios)
            low, high = median_interval(step_ratios)
            share = f"{100 * statistics.median(agent_shares):.2f} %" if agent_shares else "-"
            rows.append((
                framework, WORK[framework],
                f"{statistics.median(s[0] for s in steps):.3f}", f"{statistics.median(s[1] for s in steps):.3f}",
                f"{ratio:.3f}x ({min(step_ratios):.3f}-{max(step_ratios):.3f})", f"{low:.3f}-{high:.3f}",
                f"{statistics.median(median_ratios):.3f}x", f"{statistics.median(total_ratios):.3f}x", share,
                "PASS" if ratio <= 1.01 else "FAIL",
            ))  # fmt: skip
    print()
    header = ("framework", "work", "mean step ms without", "with", "ratio (pairs' range)", "its 95 % interval",
              "ratio of median steps", "whole run ratio", "agent thread CPU / run", "<= 1.01x")  # fmt: skip
    print(table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
