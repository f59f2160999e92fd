"""The framework integrations against the real libraries: a real training process per framework (transformers'
Trainer, Lightning, Stable-Baselines3) logs through a real nats-server into a real daemon. Each script below
is the README's example for its framework, with the sizes a test can afford."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Daemon, NatsServer, wait_for

HF = """
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from trainvigil.integrations import TrainerCallback

torch.manual_seed(0)
config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)

class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}

args = TrainingArguments(output_dir=sys.argv[1], max_steps=20, logging_steps=5, save_steps=10, eval_strategy="steps",
                         eval_steps=10, per_device_train_batch_size=4, report_to=[], use_cpu=True, disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(),
                  callbacks=[TrainerCallback(run_id="hf-gpt2")])
trainer.train()
"""

LIGHTNING = """
import sys, torch, lightning as L
from trainvigil.integrations import GradNormCallback, LightningLogger

class Regression(L.LightningModule):
    def __init__(self, lr=0.01):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(8, 1)
    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss
    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

torch.manual_seed(0)
x = torch.randn(256, 8)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
trainer = L.Trainer(max_epochs=2, logger=LightningLogger(run_id="pl-regression"), callbacks=[GradNormCallback()],
                    log_every_n_steps=4, gradient_clip_val=1.0, accelerator="cpu", devices=1,
                    enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[1])
trainer.fit(Regression(), data, data)
"""

SB3 = """
from stable_baselines3 import PPO
from trainvigil.integrations import SB3Callback

model = PPO("MlpPolicy", "CartPole-v1", n_steps=256, batch_size=64, n_epochs=4, seed=0, device="cpu")
model.learn(total_timesteps=2048, callback=SB3Callback(run_id="sb3-cartpole"))
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("integrations")
    server = NatsServer(tmp / "js")
    server.start()
    d = Daemon(server.url, tmp / "data")
    d.start()
    try:
        yield d
    finally:
        d.terminate()
        server.stop()


def _train(daemon: Daemon, script: str, tmp_path: Path) -> None:
    env = {**os.environ, "VIGIL_NATS_URL": daemon.nats_url, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _ended(daemon: Daemon, run_id: str) -> None:
    wait_for(lambda: daemon.scalar(f"select count(*) from runs where run_id = '{run_id}' and status = 'ok'") == 1,
             30, f"{run_id} ended ok")  # fmt: skip


def _count(daemon: Daemon, run_id: str, column: str) -> int:
    return int(daemon.scalar(f"select count({column}) from steps where run_id = '{run_id}'"))


def _events(daemon: Daemon, run_id: str) -> list[str]:
    return [r[0] for r in daemon.sql(f"select kind from events where run_id = '{run_id}' order by time").rows]


def test_hugging_face_trainer_logs_steps_evals_checkpoints_and_ends_the_run(daemon: Daemon, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _train(daemon, HF, tmp_path)
    run = "hf-gpt2"
    _ended(daemon, run)
    assert _count(daemon, run, "step_time") == 20, "a step time at every optimizer step"
    losses = daemon.sql(f"select step from steps where run_id = '{run}' and loss is not null order by step").rows
    assert [r[0] for r in losses] == [5, 10, 15, 20]  # the Trainer's logging_steps
    assert _count(daemon, run, "grad_norm") == 4 and _count(daemon, run, "lr") == 4
    evals = daemon.sql(f"select step from steps where run_id = '{run}' and extra['eval_loss'] is not null").rows
    assert sorted(r[0] for r in evals) == [10, 20]
    kinds = _events(daemon, run)
    assert kinds.count("eval") == 2 and {"run_start", "train_begin", "train_summary", "train_end", "run_end"} <= set(
        kinds
    )
    saves = daemon.sql(f"select step, path from checkpoints where run_id = '{run}' and origin = 'save' order by step")
    assert [(s, Path(p).name) for s, p in saves.rows] == [(10, "checkpoint-10"), (20, "checkpoint-20")]
    config = daemon.scalar(
        f"select fields->>'$.config.max_steps' from events where run_id = '{run}' and kind = 'run_start'"
    )
    assert config == "20"


def test_lightning_logger_and_callback_log_grad_norm_every_step_and_the_modules_metrics(
    daemon: Daemon, tmp_path: Path
) -> None:
    pytest.importorskip("lightning")
    _train(daemon, LIGHTNING, tmp_path)
    run = "pl-regression"
    _ended(daemon, run)
    assert _count(daemon, run, "grad_norm") == 32, "2 epochs x 16 batches: every optimizer step"
    assert _count(daemon, run, "step_time") >= 31
    assert _count(daemon, run, "loss") >= 7, "train_loss every 4 steps, as loss"
    assert daemon.scalar(f"select count(*) from steps where run_id = '{run}' and extra['val_loss'] is not null") >= 2
    assert "hparams" in _events(daemon, run)
    assert daemon.scalar(f"select count(*) from checkpoints where run_id = '{run}' and origin = 'save'") >= 1


def test_sb3_callback_maps_ppo_to_the_rl_detectors_names(daemon: Daemon, tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    _train(daemon, SB3, tmp_path)
    run = "sb3-cartpole"
    _ended(daemon, run)
    assert _count(daemon, run, "step_time") == 8, "2048 steps in rollouts of 256"
    assert _count(daemon, run, "reward") >= 6 and _count(daemon, run, "extra['response_len']") >= 6
    for name in ("kl", "entropy", "lr", "loss"):
        assert _count(daemon, run, name) == 8, f"{name} after every update"
    positive = f"select min(entropy) > 0 and min(kl) >= 0 from steps where run_id = '{run}' and entropy is not null"
    assert daemon.scalar(positive)
