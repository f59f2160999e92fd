"""The framework integrations against the real libraries: a real training process per framework (transformers'
Trainer, Lightning, Stable-Baselines3) logs through a real nats-server into a real daemon. Each script below
is an example script of ``examples/integrations/`` (the docs' examples), with the sizes a test can afford."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Daemon, serving, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "integrations"
"""The documented example scripts, run here with the sizes a test can afford."""
HF = ["hf_trainer.py", "{tmp}", "--steps", "20", "--log-every", "5", "--save-every", "10", "--eval-every", "10"]
LIGHTNING = ["lightning_regression.py", "{tmp}", "--epochs", "2", "--batches", "16", "--log-every", "4",
             "--grad-every", "1"]  # fmt: skip
SB3 = ["sb3_ppo.py", "--timesteps", "2048", "--rollout", "256"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with serving(tmp_path_factory.mktemp("integrations")) as d:
        yield d


def _train(daemon: Daemon, command: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "VIGIL_NATS_URL": daemon.nats_url, "PYTHONWARNINGS": "ignore"}
    script, *args = command
    argv = [sys.executable, str(EXAMPLES / script), *(a.format(tmp=tmp_path) for a in args)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]


def _ended(daemon: Daemon, run_id: str) -> None:
    wait_for(lambda: daemon.scalar(f"select count(*) from runs where run_id = '{run_id}' and status = 'ok'") == 1,
             30, f"{run_id} ended ok")  # fmt: skip


def _count(daemon: Daemon, run_id: str, column: str) -> int:
    return int(daemon.scalar(f"select count({column}) from steps where run_id = '{run_id}'"))


def _events(daemon: Daemon, run_id: str) -> list[str]:
    return [r[0] for r in daemon.sql(f"select kind from events where run_id = '{run_id}' order by time").rows]


@pytest.mark.timeout(90)  # imports transformers and trains in a process of its own: ~27 s
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


@pytest.mark.timeout(90)  # imports Stable-Baselines3 and trains PPO in a process of its own: ~27 s
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


def test_grad_norm_callback_logs_every_step_unless_that_costs_more_than_its_budget() -> None:
    pytest.importorskip("lightning")
    from trainvigil.agents.integrations.lightning import MAX_EVERY, GradNormCallback, stride

    assert stride(20e-6, 10e-3, 0.005) == 1, "20 us of a 10 ms step is 0.2 %: every step"
    assert stride(30e-6, 0.85e-3, 0.005) == 8, "30 us of a 0.85 ms step: every 8th keeps it under 0.5 %"
    assert stride(1.0, 1e-3, 0.005) == MAX_EVERY
    assert stride(1e-6, 0.0, 0.005) == MAX_EVERY, "a step that took no measurable time"
    assert GradNormCallback().every == 1, "every step until it has measured itself"
    assert GradNormCallback(every=4).every == 4
    with pytest.raises(ValueError, match="every must be at least 1"):
        GradNormCallback(every=0)
