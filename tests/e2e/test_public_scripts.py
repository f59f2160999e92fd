"""Public training scripts, unmodified but for their import line, feed the detectors through the drop-ins.

``tests/_support/public_scripts/`` holds them as their repositories have them (each file names its source and
commit): karpathy's nanoGPT ``train.py`` (``import trainvigil.wandb as wandb``), CleanRL's ``ppo.py`` and ``c51.py``
(``from trainvigil.tensorboard import SummaryWriter``). Each runs here with the tiny sizes its own flags allow,
on generated data or CartPole, in a process of its own against a real nats-server and daemon. Where the flags
allow a fault (a learning rate of 1e30), the fault is what pages; else the test reads what was stored.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import Daemon, serving, wait_for

SCRIPTS = Path(__file__).resolve().parents[1] / "_support" / "public_scripts"
NANOGPT_TINY = ["--device=cpu", "--compile=False", "--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=32",
                "--block_size=32", "--batch_size=4", "--max_iters=10", "--eval_interval=5", "--eval_iters=2",
                "--log_interval=5", "--always_save_checkpoint=False", "--wandb_log=True"]  # fmt: skip
"""nanoGPT's own flags for a model of 15 000 parameters: an evaluation (one ``wandb.log``) at iterations 0, 5, 10."""
PPO_TINY = ["--no-cuda", "--total-timesteps", "512", "--num-envs", "2", "--num-steps", "64", "--update-epochs", "2"]
"""CleanRL PPO's flags for four updates of 128 CartPole steps (global steps 128 to 512)."""
C51_TINY = ["--no-cuda", "--total-timesteps", "300", "--learning-starts", "100", "--train-frequency", "10",
            "--target-network-frequency", "50", "--batch-size", "32"]  # fmt: skip
"""CleanRL C51's flags: 20 updates after 100 random steps; it logs its loss every 100th global step (at 200)."""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with serving(tmp_path_factory.mktemp("public-scripts")) as d:
        yield d


def _train(daemon: Daemon, script: Path, args: list[str], run_id: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run as its README runs it (``python script.py --flags``), from ``cwd``, under ``run_id``."""
    env = {**os.environ, "VIGIL_NATS_URL": daemon.nats_url, "VIGIL_RUN_ID": run_id, "VIGIL_FLUSH_INTERVAL": "0.05",
           "PYTHONWARNINGS": "ignore"}  # fmt: skip
    argv = [sys.executable, str(script), *args]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _ended(daemon: Daemon, run_id: str, status: str) -> None:
    ended = f"select count(*) from runs where run_id = '{run_id}' and status = '{status}'"
    wait_for(lambda: daemon.scalar(ended) == 1, 30, f"{run_id} ended {status}")


def _pages(daemon: Daemon, run_id: str) -> list[tuple[str, int | None]]:
    rows = daemon.sql(f"select detector, step from anomalies where run_id = '{run_id}' and severity = 'page'").rows
    return sorted((r[0], r[1]) for r in rows)


def _tokens(folder: Path) -> Path:
    """nanoGPT's data layout (``train.bin``, ``val.bin`` of uint16 tokens, ``meta.pkl``), generated: 64 tokens."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 20_000), ("val", 4_000)):
        rng.integers(0, 64, n, dtype=np.uint16).tofile(folder / f"{split}.bin")
    (folder / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 64}))
    return folder


@pytest.mark.timeout(120)  # imports torch in a process of its own and trains: ~4 s
def test_nanogpt_train_py_logs_its_evals_as_loss_and_val_loss_and_a_diverged_loss_pages(
    daemon: Daemon, tmp_path: Path
) -> None:
    data = _tokens(tmp_path / "tokens")
    # nanoGPT reads configurator.py from the working directory, as its README runs it: from its own folder.
    args = [*NANOGPT_TINY, f"--dataset={data}", f"--out_dir={tmp_path / 'out'}", "--learning_rate=1e30"]
    done = _train(daemon, SCRIPTS / "nanogpt" / "train.py", args, "nanogpt", SCRIPTS / "nanogpt")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 5: train loss nan" in done.stdout, "the fault: AdamW at lr 1e30 diverges after one step"
    _ended(daemon, "nanogpt", "ok")  # train.py never calls wandb.finish(): the agent ends the run at exit

    rows = daemon.sql(
        "select step, loss, extra['train/loss'], extra['val_loss'], extra['val/loss'], lr, extra['iter'] "
        "from steps where run_id = 'nanogpt' order by step"
    ).rows
    assert [r[0] for r in rows] == [0, 1, 2], "one wandb.log per evaluation: W&B's implicit steps"
    assert [r[6] for r in rows] == [0, 5, 10], "nanoGPT's iteration, under its own name"
    first = rows[0]
    assert 3.0 < first[1] == first[2] < 6.0 and first[3] == first[4], "a loss near ln(64) at initialisation"
    assert first[5] > 1e26, "lr, the detectors' name already, logged as it is"
    assert all(r[1] != r[1] and r[3] != r[3] for r in rows[1:]), "NaN under loss and val_loss"
    assert _pages(daemon, "nanogpt") == [("non_finite", 1)]
    config = daemon.scalar("select fields->'$.config' from events where run_id = 'nanogpt' and kind = 'run_start'")
    config = json.loads(config) if isinstance(config, str) else config
    assert config["learning_rate"] == 1e30 and config["wandb"] == {"project": "owt", "name": "gpt2"}


@pytest.mark.timeout(120)
def test_cleanrl_ppo_py_feeds_entropy_kl_and_lr_and_stays_silent_when_healthy(daemon: Daemon, tmp_path: Path) -> None:
    pytest.importorskip("tyro")
    pytest.importorskip("gymnasium")
    done = _train(daemon, SCRIPTS / "cleanrl" / "ppo.py", PPO_TINY, "cleanrl-ppo", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    _ended(daemon, "cleanrl-ppo", "ok")
    rows = daemon.sql(
        "select step, entropy, extra['losses/entropy'], kl, extra['losses/approx_kl'], lr, "
        "extra['charts/learning_rate'], extra['losses/value_loss'] from steps where run_id = 'cleanrl-ppo' "
        "order by step"
    ).rows
    assert [r[0] for r in rows] == [128, 256, 384, 512], "an update per 128 global steps"
    for _, entropy, entropy_tag, kl, kl_tag, lr, lr_tag, value_loss in rows:
        assert 0 < entropy == entropy_tag <= np.log(2) + 1e-6, "CartPole's two actions: entropy in (0, ln 2]"
        assert kl == kl_tag and kl == kl, "approx_kl as kl"
        assert lr == lr_tag and value_loss > 0
    assert [r[5] for r in rows] == pytest.approx([2.5e-4, 1.875e-4, 1.25e-4, 6.25e-5]), "PPO's annealed lr"
    text = daemon.scalar("select fields->>'$.tag' from events where run_id = 'cleanrl-ppo' and kind = 'text'")
    assert text == "hyperparameters", "add_text: an event"
    assert _pages(daemon, "cleanrl-ppo") == []


@pytest.mark.timeout(120)
def test_cleanrl_ppo_py_that_crashes_on_a_diverged_policy_pages_run_failed(daemon: Daemon, tmp_path: Path) -> None:
    pytest.importorskip("tyro")
    pytest.importorskip("gymnasium")
    done = _train(daemon, SCRIPTS / "cleanrl" / "ppo.py", [*PPO_TINY, "--learning-rate", "1e30"], "ppo-nan", tmp_path)
    assert done.returncode != 0 and "ValueError" in done.stderr, done.stderr[-3000:]
    _ended(daemon, "ppo-nan", "error")
    assert [detector for detector, _ in _pages(daemon, "ppo-nan")] == ["run_failed"]
    message = daemon.scalar("select message from anomalies where run_id = 'ppo-nan' and detector = 'run_failed'")
    assert "ValueError" in message, message


@pytest.mark.timeout(120)
def test_cleanrl_c51_py_logs_its_loss_as_loss_and_a_diverged_loss_pages(daemon: Daemon, tmp_path: Path) -> None:
    pytest.importorskip("tyro")
    pytest.importorskip("gymnasium")
    done = _train(daemon, SCRIPTS / "cleanrl" / "c51.py", [*C51_TINY, "--learning-rate", "1e30"], "c51", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    _ended(daemon, "c51", "ok")
    rows = daemon.sql(
        "select step, loss, extra['losses/loss'], extra['losses/q_values'] from steps where run_id = 'c51' "
        "and loss is not null order by step"
    ).rows
    assert [r[0] for r in rows] == [200], "the loss at every 100th global step once training started"
    assert all(r[1] != r[1] and r[2] != r[2] for r in rows), "NaN under losses/loss and loss"
    assert _pages(daemon, "c51") == [("non_finite", 200)]
