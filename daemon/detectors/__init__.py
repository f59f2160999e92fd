"""Streaming anomaly detectors: the seam between decoding and storing.

A detector is a small class: settings (a :class:`DetectorSettings` subclass, ``Settings``)
in ``__init__``, work in ``__call__``, which sees every decoded batch once, in stream order,
and returns the alert updates it raises (see :class:`~._base.Episodes`). State is per
(run, rank) with bounded memory, dropped when ``run_all`` says a stream or run is over
(``forget``, ``forget_run``). Adding one means one module and one line in ``REGISTRY``; its
settings then appear in the daemon configuration as ``[detectors.<name>]`` (TOML) and
``VIGIL_DETECTORS_<NAME>_<KEY>`` (environment), ``enabled = false`` leaving it out.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ._base import Detector, DetectorSettings, Episodes, Finding, StreamDetector
from ._isolation import DetectorFailures, select_runs
from ._runner import Detectors, run_all
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

__all__ = [
    "REGISTRY",
    "Detector",
    "DetectorFailures",
    "DetectorSettings",
    "Detectors",
    "DetectorsConfig",
    "Episodes",
    "Finding",
    "StreamDetector",
    "build",
    "run_all",
    "select_runs",
]

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
    [
        # Shared by every detector: a stream silent this long is over (it never sent run_end).
        ("idle_forget_s", Annotated[float, msgspec.Meta(gt=0)], 3600.0),
        *[(d.name, d.Settings, msgspec.field(default_factory=d.Settings)) for d in REGISTRY],
    ],
    frozen=True,
    forbid_unknown_fields=True,
    module=__name__,
)
"""``[detectors]``: ``idle_forget_s``, then one table of settings per registered detector
(``detectors.grad_spike.warn_z`` ...)."""


def build(settings: msgspec.Struct) -> Detectors:
    """A fresh instance of every enabled detector, from its table of ``settings``
    (a :data:`DetectorsConfig`, e.g. ``DaemonConfig.detectors``)."""
    tables: Any = settings  # built by defstruct: its fields are not known statically
    chosen = [(d, getattr(tables, d.name)) for d in REGISTRY]
    return Detectors((d(settings) for d, settings in chosen if settings.enabled), idle_forget_s=tables.idle_forget_s)
