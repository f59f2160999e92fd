"""Stable-Baselines3: ``model.learn(total_timesteps, callback=trainvigil.integrations.SB3Callback())``.

One row per rollout (on-policy: collect, then train), at step = the rollout's number: ``reward`` and
``response_len`` (the mean return and length of the episodes that ended in it, read from SB3's
``ep_info_buffer``: at most its last 100, filled by the ``Monitor`` wrapper SB3 puts on every env),
``step_time`` (the wall time since the previous rollout ended) and ``timesteps`` (env steps so far).
The update that followed a rollout is logged at that rollout's step, with SB3's logger keys renamed
to what the RL detectors read: ``train/approx_kl`` -> ``kl`` (``kl_explode``),
``-train/entropy_loss`` -> ``entropy`` (``reward_hack``), ``train/learning_rate`` -> ``lr``,
``train/loss`` -> ``loss``, and ``clip_fraction``, ``explained_variance``, ``value_loss``,
``pg_loss`` as they are. So ``reward_hack`` and ``kl_explode`` work with no configuration. The run
ends with ``learn()``; a crash ends it ``error`` as any script's does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from trainvigil.agents.integrations._attach import Attached, numbers

RENAMED = {
    "train/approx_kl": "kl",
    "train/learning_rate": "lr",
    "train/loss": "loss",
    "train/clip_fraction": "clip_fraction",
    "train/explained_variance": "explained_variance",
    "train/value_loss": "value_loss",
    "train/policy_gradient_loss": "pg_loss",
    "train/n_updates": "n_updates",
}
"""SB3 logger keys -> the names trainvigil logs them under (``train/entropy_loss`` becomes ``entropy``, negated)."""


class SB3Callback(BaseCallback):
    """Logs a Stable-Baselines3 ``learn()`` through trainvigil (see the module's docstring).

    Args:
        run_id: default ``VIGIL_RUN_ID``, else generated.
        config: the run's config (default: the algorithm's class, learning rate and ``n_steps``/``batch_size``).
        **options: agent options (``trainvigil.init``'s), e.g. ``nats_url=...``.
    """

    def __init__(self, run_id: str | None = None, *, config: Mapping[str, Any] | None = None, **options: Any) -> None:
        super().__init__()
        self.run_id, self.config, self.options = run_id, config, options
        self._attached = Attached()
        self._rollout = 0
        self._last_episode: Any = None
        self._ended_at = 0.0

    def _on_training_start(self) -> None:
        model = self.model
        config = self.config
        if config is None:
            config = {"algorithm": type(model).__name__, "env_steps": int(self.locals.get("total_timesteps", 0))}
            for name in ("n_steps", "batch_size", "n_epochs", "gamma", "ent_coef", "target_kl"):
                value = getattr(model, name, None)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    config[name] = value
            lr = getattr(model, "learning_rate", None)
            if isinstance(lr, int | float):
                config["learning_rate"] = lr
        agent = self._attached.start(self.run_id, None, None, config, self.options)
        agent.event("train_begin", step=self._rollout, framework="stable-baselines3")
        self._ended_at = time.perf_counter()

    # Nothing per environment step: the episodes are read from SB3's own buffer per rollout. SB3 calls
    # update_locals and on_step at every env step; BaseCallback's copy the rollout's ~30 locals and count,
    # which this callback never reads (its step is the rollout's number, num_timesteps the model's).
    def update_locals(self, locals_: dict[str, Any]) -> None:
        pass

    def on_step(self) -> bool:
        return True

    def _on_step(self) -> bool:  # BaseCallback declares it abstract; on_step above never calls it
        return True

    def _new_episodes(self) -> list[dict[str, Any]]:
        """The episodes SB3 recorded (``ep_info_buffer``, its Monitor's ``episode`` infos) since the last call:
        those after the last one seen, by identity (the buffer keeps the last 100)."""
        buffer = list(getattr(self.model, "ep_info_buffer", None) or ())
        last, self._last_episode = self._last_episode, buffer[-1] if buffer else None
        for i in range(len(buffer) - 1, -1, -1):
            if buffer[i] is last:
                return buffer[i + 1 :]
        return buffer

    def _on_rollout_end(self) -> None:
        agent = self._attached.agent
        if agent is None:
            return
        self._log_update()  # the update after the previous rollout, if it logged one
        self._rollout += 1
        now = time.perf_counter()
        row: dict[str, float] = {"step_time": now - self._ended_at, "timesteps": float(self.model.num_timesteps)}
        self._ended_at = now
        episodes = self._new_episodes()
        if episodes:
            row["reward"] = float(np.mean([float(e["r"]) for e in episodes]))
            row["response_len"] = float(np.mean([float(e["l"]) for e in episodes]))
        agent.log(self._rollout, **row)

    def _log_update(self) -> None:
        """SB3's ``train/*`` values recorded since the last dump: the update after rollout ``self._rollout``."""
        agent = self._attached.agent
        recorded = numbers(getattr(self.logger, "name_to_value", {}))
        row = {RENAMED[k]: v for k, v in recorded.items() if k in RENAMED}
        if "train/entropy_loss" in recorded:
            row["entropy"] = -recorded["train/entropy_loss"]
        if agent is not None and row and self._rollout:
            agent.log(self._rollout, **row)

    def _on_training_end(self) -> None:
        agent = self._attached.agent
        if agent is not None:
            self._log_update()
            timesteps = self.model.num_timesteps
            agent.event("train_end", step=self._rollout, timesteps=timesteps, framework="stable-baselines3")
        self._attached.end("ok")
