"""``trainvigil.wandb``: a script written for W&B logs into a real daemon with one changed import; W&B's step
rules, its config and summary, what is refused (loudly) and what is dropped (counted)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess import InProcessDaemon
from support import NatsServer, wait_for

import trainvigil.wandb as wandb
from trainvigil.errors import VigilError

SCRIPT = """
import argparse
import math

import trainvigil.wandb as wandb

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=3e-4)
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()

run = wandb.init(project="compat", name="demo", config=args)
wandb.config.update({"batch_size": 32})
for step in range(args.steps):
    loss = float("nan") if step == 20 else 1.0 / (step + 1)
    wandb.log({"train/loss": loss, "examples": wandb.Image(None), "note": "text"}, commit=False)
    if step % 10 == 9:
        wandb.log({"val/loss": 0.5}, step=step)  # the current step, given: merged, not committed
    wandb.log({"lr": args.lr, "charts/episodic_return": float(step)})
wandb.summary["best_loss"] = 1.0 / args.steps
wandb.alert(title="done", text="training finished", level=wandb.AlertLevel.INFO)
wandb.finish()
"""


def _fields(daemon: InProcessDaemon, run_id: str, kind: str) -> list[dict[str, object]]:
    rows = daemon.sql(f"select fields from events where run_id = '{run_id}' and kind = '{kind}' order by time").rows
    return [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in rows]


def test_a_wandb_script_logs_under_its_names_and_the_detectors_and_a_nan_loss_pages(
    daemon: InProcessDaemon, nats_server: NatsServer, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "VIGIL_NATS_URL": nats_server.url, "VIGIL_RUN_ID": "wb-demo", "VIGIL_FLUSH_INTERVAL": "0.05"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("dropped 'examples'") == 1 and done.stderr.count("dropped 'note'") == 1, done.stderr
    wait_for(lambda: daemon.scalar("select count(*) from runs where run_id = 'wb-demo' and status = 'ok'") == 1,
             30, "the run ended ok")  # fmt: skip

    rows = daemon.sql(
        "select step, loss, extra['train/loss'], lr, extra['lr'], reward, extra['charts/episodic_return'], "
        "extra['val_loss'], extra['val/loss'] from steps where run_id = 'wb-demo' order by step"
    ).rows
    assert [r[0] for r in rows] == list(range(30)), "one row per implicit step: commit=False calls merged"
    for step, loss, train_loss, lr, lr_extra, reward, ret, val, val_orig in rows:
        if step == 20:
            assert loss != loss and train_loss != train_loss  # NaN under both names
        else:
            assert loss == train_loss == pytest.approx(1.0 / (step + 1))
        assert lr == 3e-4 and lr_extra is None, "lr is the detectors' name already: logged once"
        assert reward == ret == float(step)
        assert (val, val_orig) == ((0.5, 0.5) if step % 10 == 9 else (None, None))

    pages = daemon.sql("select step, severity from anomalies where run_id = 'wb-demo' and detector = 'non_finite'")
    assert [tuple(r) for r in pages.rows] == [(20, "page")]

    start = _fields(daemon, "wb-demo", "run_start")[0]["config"]
    assert isinstance(start, dict) and start["lr"] == 3e-4 and start["wandb"] == {"project": "compat", "name": "demo"}
    assert _fields(daemon, "wb-demo", "config") == [{"batch_size": 32}]
    assert _fields(daemon, "wb-demo", "summary") == [{"best_loss": 1.0 / 30}]
    assert _fields(daemon, "wb-demo", "alert") == [{"title": "done", "text": "training finished", "level": "INFO"}]
    dropped = _fields(daemon, "wb-demo", "compat_dropped")
    assert dropped == [{"shim": "wandb", "dropped": {"examples": 30, "note": 30}}]


@pytest.fixture
def run() -> Iterator[wandb.Run]:
    """A disabled run (no broker): the shim's own logic."""
    started = wandb.init(project="units", mode="disabled")
    yield started
    wandb.finish()


def test_the_implicit_step_advances_on_commit_and_step_sets_it(run: wandb.Run) -> None:
    assert run.step == 0
    wandb.log({"loss": 1.0})
    wandb.log({"loss": 1.0}, commit=True)
    assert run.step == 2
    wandb.log({"loss": 1.0}, commit=False)
    assert run.step == 2, "commit=False stays on the step"
    wandb.log({"loss": 1.0}, step=10)
    assert run.step == 10, "step= without commit stays on that step (W&B: commit defaults to False with step=)"
    wandb.log({"loss": 1.0}, step=10, commit=True)
    assert run.step == 11
    wandb.log({"loss": 1.0}, step=3)
    assert run.step == 11 and run.dropped == {"<behind current step>": 1}, "a step behind is dropped, as W&B does"
    wandb.log([1.0])  # type: ignore[arg-type]
    assert run.step == 11 and run.dropped["<not a dict>"] == 1, "never raises into the loop"


def test_disabled_mode_starts_no_agent_and_logs_nothing(run: wandb.Run) -> None:
    assert run.agent.options.enabled is False
    for step in range(100):
        wandb.log({"train/loss": 1.0 / (step + 1)})
    assert run.agent.stats()["connected"] is False
    assert wandb.run is run and wandb.config is run.config


def test_non_numbers_are_dropped_counted_and_warned_once_per_name(
    run: wandb.Run, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="trainvigil.wandb"):
        for _ in range(3):
            wandb.log({"img": wandb.Image([[0]]), "table": wandb.Table(columns=["a"]), "tag": "x", "loss": 1.0})
            wandb.log({"hist": wandb.Histogram([1, 2]), "nested": {"acc": 0.5, "name": "n"}})
    assert run.dropped == {"img": 3, "table": 3, "tag": 3, "hist": 3, "nested.name": 3}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 5 and all("dropped" in w for w in warned)


def test_unknown_calls_raise_one_line_naming_the_call(run: wandb.Run) -> None:
    with pytest.raises(AttributeError, match=r"^trainvigil\.wandb has no 'log_artifact': ") as module:
        wandb.log_artifact("model.pt")
    with pytest.raises(AttributeError, match=r"^trainvigil\.wandb\.Run has no 'use_artifact': ") as method:
        run.use_artifact("data:latest")
    assert "\n" not in str(module.value) and "\n" not in str(method.value)
    with pytest.raises(AttributeError, match=r"wandb\.config has no key 'missing'"):
        _ = wandb.config.missing


def test_config_takes_attribute_and_dict_access_and_namespaces(run: wandb.Run) -> None:
    wandb.config.update(__import__("argparse").Namespace(lr=0.1, layers=2))
    wandb.config.dropout = 0.5
    wandb.config["epochs"] = 3
    assert wandb.config.lr == 0.1 and wandb.config["dropout"] == 0.5 and dict(wandb.config)["epochs"] == 3
    wandb.define_metric("val/loss", summary="min")  # accepted
    wandb.Settings(start_method="thread")  # accepted


def test_log_before_init_says_to_call_init() -> None:
    assert wandb.run is None
    with pytest.raises(VigilError, match=r"call wandb.init\(project=...\) first"):
        wandb.log({"loss": 1.0})


def test_wandb_mode_disabled_in_the_environment_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    started = wandb.init(project="env")
    try:
        assert started.agent.options.enabled is False
    finally:
        wandb.finish()


def test_reinit_returns_the_running_run_unless_asked() -> None:
    first = wandb.init(mode="disabled")
    try:
        assert wandb.init(mode="disabled") is first
        second = wandb.init(mode="disabled", reinit=True)
        assert second is not first and wandb.run is second
    finally:
        wandb.finish()
    assert wandb.run is None
