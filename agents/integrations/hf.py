"""Hugging Face ``transformers.Trainer``: ``Trainer(..., callbacks=[trainvigil.integrations.TrainerCallback()])``.

Per optimizer step, every rank logs ``step_time`` (the wall time since the previous step ended) and
``samples`` (its examples so far), so ``slowdown`` and ``straggler`` see each rank. Each Trainer log
adds ``loss``, ``lr`` (the Trainer's ``learning_rate``), ``grad_norm`` (the Trainer's, taken before
clipping: what ``grad_spike`` needs) and ``epoch`` at its step; an evaluation's ``eval_*`` metrics
are logged at its step (``eval_loss`` is what ``generalisation`` reads) and sent as an ``eval`` event.
Each checkpoint the Trainer saves is digested from the model's state dict in the background
(``checkpoints`` in SQL, ``vigil verify``). The run starts with the Trainer's arguments as its config
(rank and world size from them) and ends with the training, ``ok``; a crash ends it ``error`` as any
script's does. With an agent already started by ``trainvigil.init()``, that agent is used and left open.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import transformers

from trainvigil.agents.integrations._attach import Attached, numbers

RENAMED = {"learning_rate": "lr"}
"""The Trainer's log keys that the detectors know by another name."""
SUMMARY = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss")
"""Keys of the Trainer's last log: a summary of the whole training, sent as a ``train_summary`` event."""
CONFIG_KEYS = (
    "learning_rate", "weight_decay", "max_grad_norm", "num_train_epochs", "max_steps", "warmup_steps",
    "lr_scheduler_type", "per_device_train_batch_size", "gradient_accumulation_steps", "seed", "optim",
)  # fmt: skip


class TrainerCallback(transformers.TrainerCallback):
    """Logs a ``transformers.Trainer`` run through trainvigil (see the module's docstring).

    Args:
        run_id: shared by every rank; default ``VIGIL_RUN_ID`` (or torchrun's), else generated.
        config: the run's config (default: the main ``TrainingArguments``).
        **options: agent options (``trainvigil.init``'s), e.g. ``nats_url=...``.
    """

    def __init__(self, run_id: str | None = None, *, config: Mapping[str, Any] | None = None, **options: Any) -> None:
        self.run_id, self.config, self.options = run_id, config, options
        self._attached = Attached()
        self._step_ended = 0.0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        config = self.config if self.config is not None else {k: getattr(args, k, None) for k in CONFIG_KEYS}
        config = {k: v if isinstance(v, int | float | str | bool) or v is None else str(v) for k, v in config.items()}
        agent = self._attached.start(self.run_id, args.process_index, args.world_size, config, self.options)
        agent.event("train_begin", step=state.global_step, max_steps=state.max_steps, framework="transformers")
        self._step_ended = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        agent = self._attached.agent
        if agent is None:
            return
        now = time.perf_counter()
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        agent.log(state.global_step, step_time=now - self._step_ended, samples=float(state.global_step * per_step))
        self._step_ended = now

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        agent = self._attached.agent
        if agent is None or not logs:
            return
        values = numbers(logs)
        summary = {k: values.pop(k) for k in SUMMARY if k in values}
        if summary:
            agent.event("train_summary", step=state.global_step, **summary)
        metrics = {RENAMED.get(k, k): v for k, v in values.items()}
        if metrics:
            agent.log(state.global_step, **metrics)

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        agent = self._attached.agent
        if agent is not None and metrics:
            agent.event("eval", step=state.global_step, **numbers(metrics))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        agent, model = self._attached.agent, kwargs.get("model")
        if agent is None or model is None:
            return
        path = os.path.join(args.output_dir, f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        agent.checkpoint_saved(path, model.state_dict(), step=state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        agent = self._attached.agent
        if agent is not None:
            agent.event("train_end", step=state.global_step, framework="transformers")
        self._attached.end("ok")
