"""What each framework integration adds to its framework's own step time, side by side in one run.

For each framework (transformers ``Trainer``, Lightning, Stable-Baselines3) the same small model trains
the same steps without the integration and with it, alternately (``--repeats`` pairs, in fresh
processes), against a real nats-server and daemon. A run's time is the framework's own training loop
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

HF = """
import sys, time, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)
class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}
callbacks = []
if sys.argv[2] == "with":  # the agent starts before the clock: its start-up is not a step's cost
    import trainvigil
    from trainvigil.integrations import TrainerCallback
    agent = trainvigil.init(run_id=sys.argv[3])
    callbacks = [TrainerCallback()]
args = TrainingArguments(output_dir=sys.argv[1], max_steps=200, logging_steps=10, save_strategy="no",
                         per_device_train_batch_size=8, report_to=[], use_cpu=True, disable_tqdm=True)
out = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks).train()
print(out.metrics["train_runtime"])
"""

LIGHTNING = """
import sys, time, torch, lightning as L
class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
torch.manual_seed(0)
x = torch.randn(8192, 64)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=32)
kwargs = {"logger": False}
if sys.argv[2] == "with":
    import trainvigil
    from trainvigil.integrations import GradNormCallback, LightningLogger
    agent = trainvigil.init(run_id=sys.argv[3])
    kwargs = {"logger": LightningLogger(), "callbacks": [GradNormCallback()]}
trainer = L.Trainer(max_epochs=1, log_every_n_steps=10, accelerator="cpu", devices=1, enable_progress_bar=False,
                    enable_model_summary=False, enable_checkpointing=False, default_root_dir=sys.argv[1], **kwargs)
began = time.perf_counter()
trainer.fit(Net(), data)
print(time.perf_counter() - began)
"""

SB3 = """
import sys, time
from stable_baselines3 import PPO
model = PPO("MlpPolicy", "CartPole-v1", n_steps=512, batch_size=64, n_epochs=4, seed=0, device="cpu")
callback = None
if sys.argv[2] == "with":
    import trainvigil
    from trainvigil.integrations import SB3Callback
    agent = trainvigil.init(run_id=sys.argv[3])
    callback = SB3Callback()
began = time.perf_counter()
model.learn(total_timesteps=8192, callback=callback)
print(time.perf_counter() - began)
"""

SCRIPTS = {"transformers": HF, "lightning": LIGHTNING, "sb3": SB3}
WORK = {
    "transformers": "200 steps, GPT-2 2x64",
    "lightning": "256 steps, MLP 64-256-1",
    "sb3": "PPO CartPole 8192 env steps",
}


def timed(script: str, mode: str, run_id: str, tmp: Path, url: str) -> float:
    env = {**os.environ, "VIGIL_NATS_URL": url, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", script, str(tmp), mode, run_id], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs per framework")
    parser.add_argument("--only", choices=sorted(SCRIPTS), action="append", help="one framework (repeatable)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-integrations-") as name, contextlib.ExitStack() as stack:
        tmp = Path(name)
        svc = start_services(stack, tmp)
        for framework in args.only or list(SCRIPTS):
            without, with_ = [], []
            for k in range(args.repeats):
                without.append(timed(SCRIPTS[framework], "without", "", tmp, svc.url))
                with_.append(timed(SCRIPTS[framework], "with", f"bench-{framework}-{k}", tmp, svc.url))
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
