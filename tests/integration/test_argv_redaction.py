"""Secrets on a training command line never reach the history: ``run_start`` records ``sys.argv`` redacted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from inprocess import InProcessDaemon
from support import NatsServer, wait_for

from trainvigil.agents._redact import redact_argv

HF = "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"  # the shape of a Hugging Face token: hf_ + 34 letters and digits
SK = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
GHP = "ghp_" + "0123456789abcdefghijABCDEFGHIJ012345"


@pytest.mark.parametrize(
    ("argv", "recorded"),
    [
        (["train.py", "--hf-token", "abc123"], ["train.py", "--hf-token", "***"]),
        (["train.py", "--hf-token=abc123"], ["train.py", "--hf-token=***"]),
        (["train.py", "--wandb_api_key", "k", "--lr", "3e-4"], ["train.py", "--wandb_api_key", "***", "--lr", "3e-4"]),
        (["train.py", "--apiKey=k"], ["train.py", "--apiKey=***"]),
        (
            ["train.py", "--db-password", "pw", "--client_secret=s"],
            ["train.py", "--db-password", "***", "--client_secret=***"],
        ),
        (["train.py", "-token", "t"], ["train.py", "-token", "***"]),
        (["train.py", "--key", "-1"], ["train.py", "--key", "***"]),  # a value may start with '-'
        (["train.py", "--push-token", "--lr", "1"], ["train.py", "--push-token", "--lr", "1"]),  # a flag alone
        (["train.py", "--token"], ["train.py", "--token"]),  # the last argument: no value to hide
        (
            ["train.py", "trainer.hf_token=abc", "+db.password=pw"],
            ["train.py", "trainer.hf_token=***", "+db.password=***"],
        ),
        (["train.py", "HF_TOKEN=abc"], ["train.py", "HF_TOKEN=***"]),
        (["train.py", "--model", HF], ["train.py", "--model", "***"]),  # a known token format, whatever its flag
        (["train.py", f"--note=use {SK} here"], ["train.py", "--note=use *** here"]),
        (["train.py", GHP], ["train.py", "***"]),
        (["train.py", "--db", "postgres://me:pw@db/x"], ["train.py", "--db", "postgres://me:***@db/x"]),
        (["train.py", "--db=postgres://me:pw@db/x"], ["train.py", "--db=postgres://me:***@db/x"]),
    ],
)
def test_secret_values_are_masked(argv: list[str], recorded: list[str]) -> None:
    assert redact_argv(argv) == recorded


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--max_tokens", "2048", "--tokenizer", "gpt2", "--keyframes", "4", "--num-keys", "8"],
        ["train.py", "--lr=3e-4", "--batch-size", "32", "data/hf_cache", "--", "--sort-by", "loss"],
        ["train.py", "model.tokenizer=gpt2", "a=b", "--out", "https://host/path"],
        ["train.py", "--sha", "0123456789abcdef0123456789abcdef01234567", "--user", "me@example.com"],
        [],
    ],
)
def test_ordinary_arguments_are_kept_as_written(argv: list[str]) -> None:
    assert redact_argv(argv) == argv


def test_redacting_twice_changes_nothing_and_the_input_is_left_alone() -> None:
    argv = ["train.py", "--hf-token", HF, f"--x={SK}", "k.api_key=1"]
    once = redact_argv(argv)
    assert redact_argv(once) == once
    assert argv[2] == HF, "the caller's list is not changed"
    assert not any(secret in " ".join(once) for secret in (HF, SK))


_PRODUCER = """
import sys, trainvigil
agent = trainvigil.init(run_id=sys.argv[-1], flush_interval=0.05)
for step in range(20):
    agent.log(step, loss=1.0 / (step + 1))
sys.exit(0 if agent.close(timeout=30) else 1)
"""


def _produce(url: str, run_id: str, *args: str, env: dict[str, str] | None = None) -> None:
    """A training process whose command line carries ``args`` (and the run id last)."""
    command = [sys.executable, "-c", _PRODUCER, *args, run_id]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, "VIGIL_NATS_URL": url, **(env or {})}
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _recorded(daemon: InProcessDaemon, run_id: str) -> tuple[list[str], list[str]]:
    """The argv the history holds for ``run_id``: in its ``run_start`` event and in ``runs``."""
    wait_for(
        lambda: daemon.scalar(f"select count(*) from events where run_id = '{run_id}' and kind = 'run_end'") == 1,
        30,
        "run_end",
    )
    event = json.loads(daemon.scalar(f"select fields from events where run_id = '{run_id}' and kind = 'run_start'"))
    runs = json.loads(daemon.scalar(f"select argv from runs where run_id = '{run_id}'"))
    return event["argv"], runs


def test_a_token_on_the_command_line_is_not_stored(daemon: InProcessDaemon, nats_server: NatsServer) -> None:
    """Before: ``run_start`` kept ``--hf-token hf_...`` verbatim, for good."""
    _produce(nats_server.url, "redacted", "--hf-token", HF, f"--openai-key={SK}", "--lr", "3e-4")
    event, runs = _recorded(daemon, "redacted")
    assert event == runs == ["-c", "--hf-token", "***", "--openai-key=***", "--lr", "3e-4", "redacted"]
    everything = json.dumps(daemon.sql("select * from events where run_id = 'redacted'").rows, default=str)
    assert HF not in everything and SK not in everything


def test_vigil_redact_argv_0_records_the_command_line_verbatim(
    daemon: InProcessDaemon, nats_server: NatsServer
) -> None:
    _produce(nats_server.url, "verbatim", "--hf-token", HF, env={"VIGIL_REDACT_ARGV": "0"})
    event, _ = _recorded(daemon, "verbatim")
    assert event == ["-c", "--hf-token", HF, "verbatim"]
