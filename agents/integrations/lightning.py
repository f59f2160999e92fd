"""PyTorch Lightning: ``Trainer(logger=LightningLogger(), callbacks=[GradNormCallback()])``.

``LightningLogger`` sends what the module logs with ``self.log(...)`` (at Lightning's
``log_every_n_steps``) as metrics at the trainer's global step (``train_loss`` as ``loss``; ``val_loss``
as it is: what ``generalisation`` reads), the hyper-parameters as the run's ``hparams`` event, and
each saved checkpoint's digest. ``GradNormCallback`` logs, at every optimizer step of every rank, the
global gradient norm before clipping (``on_before_optimizer_step``: Lightning clips after it) and
the ``step_time``, so ``grad_spike``, ``slowdown`` and ``straggler`` see each rank; it also starts the
agent with the trainer's rank and world size.

The training loop comes first: the callback times its own work and, when it would take more than
``budget`` (0.5 %) of a step, logs every k-th optimizer step only (``step_time`` then the mean over
the k steps), k the smallest that keeps it within budget. A step of a few milliseconds or more is
always logged; a CPU toy model whose Lightning step is 0.85 ms is logged every ~17th (a logged
step's norm and log took 30-70 us of it in the loop). ``every=1`` logs every step whatever it costs.

The run ends with ``fit``: ``ok``, or ``error`` when Lightning reports it failed. With an agent
already started by ``trainvigil.init()``, that one is used.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger

from trainvigil.agents.agent import Agent, current_agent
from trainvigil.agents.integrations._attach import Attached, numbers
from trainvigil.agents.torch_watch import per_tensor_norms

BUDGET = 0.005
"""The share of a step ``GradNormCallback`` may take (its own measured work over the measured step time)."""
MAX_EVERY = 64
"""The longest stride the budget may choose: ``grad_spike`` still sees a norm every 64 steps."""
RENAMED = {"train_loss": "loss", "lr-AdamW": "lr", "lr-Adam": "lr", "lr-SGD": "lr"}
"""Names Lightning users commonly log that the detectors know by another name."""
_attached = Attached()
"""One agent per process, shared by the logger and the callback (whichever starts first)."""


def _agent(run_id: str | None, rank: int | None, world_size: int | None, options: Mapping[str, Any]) -> Agent:
    return current_agent() or _attached.start(run_id, rank, world_size, None, options)


class LightningLogger(Logger):
    """A Lightning logger that logs through trainvigil (see the module's docstring).

    Args:
        run_id: shared by every rank; default ``VIGIL_RUN_ID`` (or torchrun's), else generated.
        **options: agent options (``trainvigil.init``'s), e.g. ``nats_url=...``.
    """

    def __init__(self, run_id: str | None = None, **options: Any) -> None:
        super().__init__()
        self.run_id, self.options = run_id, options

    @property
    def name(self) -> str:
        return "trainvigil"

    @property
    def version(self) -> str:
        agent = current_agent()
        return agent.run_id if agent is not None else (self.run_id or "")

    def _start(self) -> Agent:
        world = os.environ.get("WORLD_SIZE")
        return _agent(self.run_id, rank_zero_only.rank, int(world) if world else None, self.options)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        values = dict(vars(params)) if hasattr(params, "__dict__") and not isinstance(params, Mapping) else params
        fields: dict[str, Any] = {str(k): v if isinstance(v, int | float | str | bool) or v is None else str(v)
                                  for k, v in dict(values or {}).items()}  # fmt: skip
        if "step" in fields:  # the event's own step: a hyper-parameter of that name keeps its value as hparam_step
            fields["hparam_step"] = fields.pop("step")
        self._start().event("hparams", None, **fields)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        values = {RENAMED.get(k, k): v for k, v in numbers(metrics).items() if k != "epoch"}
        if values and step is not None:
            self._start().log(int(step), **values)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        agent, path = (
            current_agent(),
            getattr(checkpoint_callback, "last_model_path", "") or getattr(checkpoint_callback, "best_model_path", ""),
        )
        if agent is not None and path:
            agent.event("checkpoint", path=str(path))

    def finalize(self, status: str) -> None:
        _attached.end("error" if status == "failed" else "ok")


def stride(cost_s: float, step_s: float, budget: float) -> int:
    """Log every this many steps so that ``cost_s`` of work per logged step stays within ``budget`` of a
    ``step_s`` step (1 when it already does; at most ``MAX_EVERY``)."""
    if step_s <= 0:
        return MAX_EVERY
    return min(MAX_EVERY, max(1, math.ceil(cost_s / (budget * step_s))))


class GradNormCallback(Callback):
    """Per optimizer step and rank: the pre-clip global grad norm and the step time (see the module's docstring).

    Args:
        run_id, **options: as :class:`LightningLogger`'s (default: the logger's).
        every: log every this many optimizer steps; ``None`` (default): every step unless that costs
            more than ``budget`` of the step, then the smallest stride within it (at most ``MAX_EVERY``).
        budget: the share of a step the callback may take when ``every`` is ``None``.
    """

    def __init__(self, run_id: str | None = None, *, every: int | None = None, budget: float = BUDGET,
                 **options: Any) -> None:  # fmt: skip
        if every is not None and every < 1:
            raise ValueError(f"every must be at least 1, not {every}")
        self.run_id, self.options = run_id, options
        self.every, self.budget = every or 1, budget
        self._auto = every is None
        self._since = 0
        """Optimizer steps since the last one logged."""
        self._step_began = 0.0
        self._params: list[torch.nn.Parameter] | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._params = None  # read again at the first step of this fit
        # The logger's run id and options when the callback was given none: one run, whoever starts it.
        ours = next((lg for lg in trainer.loggers if isinstance(lg, LightningLogger)), None)
        run_id = self.run_id or (ours.run_id if ours is not None else None)
        options = self.options or (ours.options if ours is not None else {})
        _agent(run_id, trainer.global_rank, trainer.world_size, options)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self._step_began:
            self._step_began = time.perf_counter()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._since += 1
        if self._since < self.every:
            return
        agent = current_agent()
        if agent is None:
            return
        began = time.perf_counter()
        values: dict[str, Any] = {}
        if self._step_began:
            values["step_time"] = (began - self._step_began) / self._since
        self._step_began, self._since = began, 0
        if self._params is None:
            self._params = list(pl_module.parameters())
        norms = per_tensor_norms([p.grad for p in self._params if p.grad is not None])  # watch()'s fused norms
        if norms is not None:  # handed over as a tensor: the agent's thread reads it, the loop never syncs
            values["grad_norm"] = torch.linalg.vector_norm(norms[0])
        agent.log(trainer.global_step, **values)
        if self._auto and "step_time" in values:
            self.every = stride(time.perf_counter() - began, values["step_time"], self.budget)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        agent = current_agent()
        state = checkpoint.get("state_dict")
        if agent is not None and state:  # the file's name is not known yet here: its folder and step name it
            folder = getattr(trainer.checkpoint_callback, "dirpath", None) or trainer.default_root_dir
            agent.checkpoint_saved(f"{folder} (step {trainer.global_step})", state, step=trainer.global_step)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            _attached.end("error" if trainer.interrupted else "ok")
