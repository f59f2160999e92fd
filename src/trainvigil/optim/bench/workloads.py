"""The benchmark's workloads: the canary's supervised and RL jobs, and a noisy 128-d quadratic with saddles.

Each is a :class:`Workload`: its parameters, and :meth:`Workload.step`, one training step with a
given optimizer (forward, backward, gradient clipping at the workload's ``max_norm``, the
optimizer's step) returning the loss to report. The data a step sees depends only on the seed
and the step, never on the optimizer, so every optimizer meets the same data in the same order.

An optimizer with ``hessian_due`` and ``update_hessian(sampled_loss, batch_size)`` (Sophia-G) gets
its Gauss-Newton-Bartlett loss on the steps it asks for.

The supervised and quadratic workloads run on any device (``device="cuda"``): the model lives
there, while the seed's draws are made on the CPU and moved, so the data do not depend on the device.
The RL workload's environment is CPU tensors: it runs on the CPU only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from trainvigil.canary import _grid as env
from trainvigil.canary import rl, supervised
from trainvigil.canary._common import setup
from trainvigil.optim.sophia import gnb_gaussian_loss, gnb_loss


class Workload(Protocol):
    name: str
    max_norm: float

    def parameters(self) -> list[nn.Parameter]: ...

    def step(self, optimizer: torch.optim.Optimizer) -> tuple[float, dict[str, float]]:
        """One training step; the loss to report and other metrics to log."""
        ...


def _refresh_hessian(optimizer: torch.optim.Optimizer, sampled: Callable[[], Tensor], batch_size: int) -> None:
    if getattr(optimizer, "hessian_due", False):
        optimizer.update_hessian(sampled(), batch_size=batch_size)  # type: ignore[attr-defined]


def _descend(optimizer: torch.optim.Optimizer, loss: Tensor, params: list[nn.Parameter], max_norm: float) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = float(nn.utils.clip_grad_norm_(params, max_norm))
    optimizer.step()
    return grad_norm


class Supervised:
    """The supervised canary's task and MLP (:mod:`trainvigil.canary.supervised`), without its input wait."""

    name = "supervised"
    max_norm = 1.0

    def __init__(self, seed: int, device: str = "cpu", batch_size: int = 64) -> None:
        self._gen = setup(seed)
        self._task = supervised.Task()
        self._device = torch.device(device)
        self.model = supervised.make_model().to(self._device)
        self._batch = batch_size

    def parameters(self) -> list[nn.Parameter]:
        return list(self.model.parameters())

    def step(self, optimizer: torch.optim.Optimizer) -> tuple[float, dict[str, float]]:
        x, y = (t.to(self._device) for t in self._task.draw(self._batch, self._gen))
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        _refresh_hessian(optimizer, lambda: gnb_loss(logits, self._gen), len(x))
        grad_norm = _descend(optimizer, loss, self.parameters(), self.max_norm)
        return float(loss.detach()), {"grad_norm": grad_norm}


class Reinforcement:
    """The RL canary's actor-critic on its grid world (:mod:`trainvigil.canary.rl`), any optimizer.

    The loss reported is ``1 - success rate`` of the update's episodes (the training objective
    itself hovers around 0 and changes sign); ``reward``, ``entropy`` and ``kl`` are logged as the
    canary logs them.
    """

    name = "rl"
    max_norm = 0.5  # clipped inside rl.Learner.update

    def __init__(self, seed: int, device: str = "cpu") -> None:
        if torch.device(device).type != "cpu":
            raise ValueError(f"the RL workload runs on the CPU only (its grid world is CPU tensors), not {device}")
        self._gen = setup(seed)
        self.learner = rl.Learner(1e-3, self._gen)  # its own Adam is replaced by the benchmark's optimizer

    def parameters(self) -> list[nn.Parameter]:
        return list(self.learner.model.parameters())

    def step(self, optimizer: torch.optim.Optimizer) -> tuple[float, dict[str, float]]:
        self.learner.optimizer = optimizer  # type: ignore[assignment]  # Learner only calls zero_grad and step
        r = env.play(self.learner.act, env.goals(rl.EPISODES, self._gen))
        live = r.alive.bool()

        def sampled() -> Tensor:
            return gnb_loss(self.learner.actor(r.obs[live]), self._gen) + gnb_gaussian_loss(
                self.learner.critic(r.obs[live]).squeeze(-1), self._gen
            )

        _refresh_hessian(optimizer, sampled, int(live.sum()))
        stats = self.learner.update(r)
        success = float(r.task_returns.mean())
        return 1.0 - success, {"reward": float(r.returns.mean()), **stats}


@dataclass(frozen=True)
class _Landscape:
    rotation: Tensor
    curvature: Tensor
    wells: int


class Quadratic:
    """A noisy 128-d objective, condition number 100, with saddle points: a fast sanity case.

    In rotated coordinates ``z = Q x`` (``Q`` a fixed random orthogonal matrix), the first
    ``wells`` coordinates are double wells ``c (z^2 - 1)^2 / 4`` (a saddle where any is 0) and the
    rest quadratics ``c z^2 / 2``, curvatures ``c`` log-spaced from 1 to 100. Training starts near
    the saddle, and each step's gradient carries Gaussian noise (``noise`` per coordinate, a fresh
    draw per step from the seed). The loss reported is the objective without noise; its minimum is 0.
    """

    name = "quadratic"
    max_norm = 10.0
    DIM, WELLS, CONDITION = 128, 16, 100.0

    def __init__(self, seed: int, device: str = "cpu", noise: float = 0.5) -> None:
        self._gen = setup(seed)
        self._device = torch.device(device)
        fixed = torch.Generator().manual_seed(4321)  # the landscape is the same for every seed
        q, _ = torch.linalg.qr(torch.randn(self.DIM, self.DIM, generator=fixed))
        curvature = torch.logspace(0, math.log10(self.CONDITION), self.DIM)
        self._land = _Landscape(q.to(self._device), curvature.to(self._device), self.WELLS)
        z0 = torch.ones(self.DIM)
        z0[: self.WELLS] = 1e-3 * torch.randn(self.WELLS, generator=fixed)
        self.x = nn.Parameter((q.T @ z0).to(self._device))
        self._noise = noise

    def parameters(self) -> list[nn.Parameter]:
        return [self.x]

    def objective(self, x: Tensor) -> Tensor:
        z = self._land.rotation @ x
        c, k = self._land.curvature, self._land.wells
        return (c[:k] * (z[:k] ** 2 - 1) ** 2 / 4).sum() + (c[k:] * z[k:] ** 2 / 2).sum()

    def step(self, optimizer: torch.optim.Optimizer) -> tuple[float, dict[str, float]]:
        value = self.objective(self.x)
        noisy = value + self._noise * torch.randn(self.DIM, generator=self._gen).to(self._device) @ self.x
        _refresh_hessian(optimizer, lambda: noisy, 1)  # no likelihood: the empirical Fisher
        grad_norm = _descend(optimizer, noisy, self.parameters(), self.max_norm)
        return float(value.detach()), {"grad_norm": grad_norm}


WORKLOADS: dict[str, Callable[[int, str], Workload]] = {
    "supervised": Supervised,
    "rl": Reinforcement,
    "quadratic": Quadratic,
}
"""Workload name -> its constructor (taking the seed and the device)."""
BASE_LR = {"supervised": 3e-3, "rl": 1e-3, "quadratic": 3e-2}
"""AdamW's peak LR per workload (the canaries' own); the other optimizers scale it (``specs``)."""


def check_device(device: str, workloads: list[str]) -> None:
    """Refuse, before any run, a device torch cannot use or a workload that cannot run there.

    Raises:
        ValueError: the message says what to pass instead.
    """
    try:
        where = torch.device(device)
    except RuntimeError:
        where = None
    if where is None or where.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: the benchmark runs on cpu, cuda or cuda:N")
    if where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch {torch.__version__} sees no CUDA device; run on --device cpu")
    if where.type != "cpu" and "rl" in workloads:
        raise ValueError(f"the rl workload runs on the CPU only: with --device {device}, pass --workload supervised "
                         "and/or --workload quadratic")  # fmt: skip
