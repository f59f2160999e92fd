"""The detectors every daemon runs, and the fresh set :func:`build` makes of them from their settings."""

from __future__ import annotations

from typing import Any

from trainvigil.daemon.detectors._coalesce import Coalescer
from trainvigil.daemon.detectors._runner import Detectors
from trainvigil.daemon.detectors._settings import DetectorsConfig
from trainvigil.daemon.detectors.ckpt_mismatch import CkptMismatch
from trainvigil.daemon.detectors.generalisation import Generalisation
from trainvigil.daemon.detectors.gil_contention import GilContention
from trainvigil.daemon.detectors.grad_spike import GradSpike
from trainvigil.daemon.detectors.hang import Hang
from trainvigil.daemon.detectors.kl_explode import KlExplode
from trainvigil.daemon.detectors.loss_spike import LossSpike
from trainvigil.daemon.detectors.non_finite import NonFinite
from trainvigil.daemon.detectors.reward_hack import RewardHack
from trainvigil.daemon.detectors.run_failed import RunFailed
from trainvigil.daemon.detectors.slowdown import Slowdown
from trainvigil.daemon.detectors.stall import Stall
from trainvigil.daemon.detectors.straggler import Straggler

REGISTRY: list[type[Any]] = [
    NonFinite,
    GilContention,
    CkptMismatch,
    GradSpike,
    LossSpike,
    Slowdown,
    Straggler,
    KlExplode,
    RewardHack,
    Stall,
    Hang,
    RunFailed,
    Generalisation,
]
"""The detectors every daemon runs, in order; each one's table of :class:`DetectorsConfig` is its ``Settings``."""


def build(settings: DetectorsConfig) -> Detectors:
    """A fresh instance of every enabled detector, from its table of ``settings``
    (a :class:`DetectorsConfig`, e.g. ``DaemonConfig.detectors``)."""
    chosen = [(d, getattr(settings, d.name)) for d in REGISTRY]
    return Detectors(
        (d(table) for d, table in chosen if table.enabled),
        idle_forget_s=settings.idle_forget_s,
        held=Coalescer(settings.coalesce_streams, settings.coalesce_steps, settings.coalesce_s),
    )
