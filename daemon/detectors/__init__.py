"""Streaming anomaly detectors: the seam between decoding and storing.

A detector is a small class: settings (a msgspec Struct, ``Settings``) in ``__init__``,
work in ``__call__``, which sees every decoded batch once, in stream order, and returns
the alert updates it raises (see :class:`~._base.Episodes`). State is per (run, rank)
with bounded memory. Adding one means one module and one line in ``REGISTRY``; its
settings then appear in the daemon configuration as ``[detectors.<name>]`` (TOML) and
``VIGIL_DETECTORS_<NAME>_<KEY>`` (environment).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from trainvigil.schemas import Anomaly

from ..decode import IngestBatch
from ._base import Detector, Episodes, Finding, StreamDetector
from .ckpt_mismatch import CkptMismatch
from .gil_contention import GilContention
from .grad_spike import GradSpike
from .kl_explode import KlExplode
from .loss_spike import LossSpike
from .non_finite import NonFinite
from .reward_hack import RewardHack
from .slowdown import Slowdown
from .stall import Stall
from .straggler import Straggler

if TYPE_CHECKING:
    from ..config import DaemonConfig

__all__ = ["REGISTRY", "Detector", "DetectorsConfig", "Episodes", "Finding", "StreamDetector", "build", "run_all"]

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
]
"""The detectors every daemon runs, in order."""

DetectorsConfig: type[msgspec.Struct] = msgspec.defstruct(
    "DetectorsConfig",
    [(d.name, d.Settings, msgspec.field(default_factory=d.Settings)) for d in REGISTRY],
    frozen=True,
    forbid_unknown_fields=True,
    module=__name__,
)
"""One table of settings per registered detector (``detectors.grad_spike.warn_z`` ...)."""


def build(config: DaemonConfig) -> list[Detector]:
    """A fresh instance of every registered detector with its configured settings."""
    return [d(getattr(config.detectors, d.name)) for d in REGISTRY]


def run_all(detectors: list[Detector], batch: IngestBatch) -> list[Anomaly]:
    """Every detector's anomalies for ``batch``, in registry order.

    A stream that ended cleanly (``run_end``) has its per-stream state dropped afterwards, so
    a long-lived daemon's memory follows the live runs, not every run it has ever seen.
    """
    found: list[Anomaly] = []
    for detector in detectors:
        found.extend(detector(batch))
    for source, _end in batch.run_ends:
        for detector in detectors:
            if isinstance(detector, StreamDetector):
                detector.forget((source.run_id, source.rank))
    return found
