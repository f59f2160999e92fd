"""What each framework integration adds to its framework's own step time, side by side in one run.

For each framework (transformers ``Trainer``, Lightning, Stable-Baselines3) the README's example script
(``examples/integrations/``) trains the same small model the same steps without the integration
(``--without``) and with it (``--init-first``), alternately (``--repeats`` pairs, in fresh processes),
against a real nats-server and daemon. A run's time is the framework's own training loop
(``Trainer.train``'s ``train_runtime``; ``Trainer.fit`` and ``PPO.learn`` timed around the call); the
agent is started with ``trainvigil.init()`` before the clock, so its start-up is not counted (the
integration logs through it, as it does in a script that starts its own agent). The ratio is the
median with-integration time over the median without. Target: <= 1.01.

    python bench/integrations_overhead.py                 # --repeats 3
    python bench/integrations_overhead.py --only sb3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from _procs import start_services
from tables import table

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "integrations"
COMMANDS = {
    "transformers": ["hf_trainer.py", "{tmp}", "--steps", "200", "--layers", "2", "--width", "64", "--length", "64",
                     "--batch", "8", "--log-every", "10"],
    "lightning": ["lightning_regression.py", "{tmp}", "--epochs", "1", "--batches", "2048", "--batch", "32",
                  "--features", "64", "--hidden", "256", "--log-every", "10", "--clip", "0"],
    "sb3": ["sb3_ppo.py", "--timesteps", "8192", "--rollout", "512"],
}  # fmt: skip
"""The README's example scripts (``examples/integrations/``), at sizes where a step is the framework's work."""
WORK = {
    "transformers": "200 steps, GPT-2 2x64",
    "lightning": "2048 steps, MLP 64-256-1",
    "sb3": "PPO CartPole 8192 env steps",
}


def timed(framework: str, mode: str, run_id: str, tmp: Path, url: str) -> float:
    """Seconds of the framework's own training loop, as the script prints it last."""
    env = {**os.environ, "VIGIL_NATS_URL": url, "PYTHONWARNINGS": "ignore"}
    script, *args = COMMANDS[framework]
    arm = ["--without"] if mode == "without" else ["--init-first", "--run-id", run_id]
    argv = [sys.executable, str(EXAMPLES / script), *(a.format(tmp=tmp) for a in args), *arm]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs per framework")
    parser.add_argument("--only", choices=sorted(COMMANDS), action="append", help="one framework (repeatable)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-integrations-") as name, contextlib.ExitStack() as stack:
        tmp = Path(name)
        svc = start_services(stack, tmp)
        for framework in args.only or list(COMMANDS):
            without, with_ = [], []
            for k in range(args.repeats):
                without.append(timed(framework, "without", "", tmp, svc.url))
                with_.append(timed(framework, "with", f"bench-{framework}-{k}", tmp, svc.url))
                print(f"  {framework} pair {k + 1}: {without[-1]:.2f} s without, {with_[-1]:.2f} s with", flush=True)
            ratio = statistics.median(with_) / statistics.median(without)
            verdict = "PASS" if ratio <= 1.01 else "FAIL"
            medians = f"{statistics.median(without):.2f}", f"{statistics.median(with_):.2f}"
            rows.append((framework, WORK[framework], *medians, f"{ratio:.3f}x", verdict))
    print()
    print(table(("framework", "work", "without s (median)", "with s (median)", "ratio", "<= 1.01x"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
