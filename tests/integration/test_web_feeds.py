"""The run page's "logged name → detector input" table: which detector each name a run logged through a drop-in
feeds, the run's own ``names=`` included, and the detectors that got no input (why they are silent)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from inprocess import InProcessDaemon
from support import NatsServer, wait_for

import trainvigil.wandb as wandb


def _get(daemon: InProcessDaemon, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.http_port}{path}", timeout=10) as answer:
        return answer.status, answer.read()


def test_the_run_answer_says_which_detector_each_logged_name_feeds_and_which_got_nothing(
    daemon: InProcessDaemon, nats_server: NatsServer
) -> None:
    run = wandb.init(id="feeds", names={"my/objective": "loss"}, vigil={"nats_url": nats_server.url})
    for step in range(3):
        wandb.log({"my/objective": 1.0 / (step + 1), "train/entropy_loss": -0.5, "charts/learning_rate": 3e-4,
                   "rollout/ep_rew_mean": float(step), "tokens_seen": 1000 * step})  # fmt: skip
    run.finish()
    ended = "select count(*) from runs where run_id = 'feeds' and status = 'ok'"
    wait_for(lambda: daemon.scalar(ended) == 1, 30, "the run ended")

    status, body = _get(daemon, "/api/run?id=feeds")
    assert status == 200
    info: dict[str, Any] = json.loads(body)
    rows = {row["name"]: (row["input"], row["negated"], row["detectors"]) for row in info["feeds"]}
    assert rows == {
        "my/objective": ("loss", False, ["non_finite", "loss_spike", "generalisation"]),  # the run's names=
        "train/entropy_loss": ("entropy", True, ["reward_hack"]),
        "charts/learning_rate": ("lr", False, ["reward_hack"]),
        "rollout/ep_rew_mean": ("reward", False, ["non_finite", "reward_hack"]),
        "tokens_seen": (None, False, []),
    }, "the detectors' copies (loss, entropy, lr, reward) have no rows of their own"
    silent = {row["detector"]: row["reads"] for row in info["unfed"]}
    assert silent == {"grad_spike": ["grad_norm"], "slowdown": ["step_time"], "straggler": ["step_time"],
                      "kl_explode": ["kl"]}, "reward_hack and non_finite got inputs; these none"  # fmt: skip

    status, page = _get(daemon, "/run?id=feeds")
    assert status == 200
    assert b'<table id="feeds"' in page and b"<th>logged name</th><th>detector input</th>" in page
