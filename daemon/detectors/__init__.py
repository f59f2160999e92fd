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

from trainvigil.daemon.detectors import _coalesce
from trainvigil.daemon.detectors._base import Detector, DetectorSettings, Episodes, Finding, StreamDetector
from trainvigil.daemon.detectors._coalesce import Coalescer
from trainvigil.daemon.detectors._isolation import DetectorFailures, select_runs
from trainvigil.daemon.detectors._lifecycle import IDLE_FORGET_MAX_S
from trainvigil.daemon.detectors._runner import Detectors, run_all
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
    Hang,
    RunFailed,
    Generalisation,
]
"""The detectors every daemon runs, in order."""

DetectorsConfig: type[msgspec.Struct] = msgspec.defstruct(
    "DetectorsConfig",
    [
        # Shared by every detector: a stream silent this long is over (it never sent run_end).
        ("idle_forget_s", Annotated[float, msgspec.Meta(gt=0, le=IDLE_FORGET_MAX_S)], 3600.0),
        # While a batch holds more than coalesce_streams streams, the per-step detectors judge a
        # stream once coalesce_steps of its steps wait, or the oldest waited coalesce_s (_coalesce).
        ("coalesce_streams", Annotated[int, msgspec.Meta(ge=0)], _coalesce.MIN_STREAMS),
        # ... steps of a stream that wait before it is judged, on such a batch ...
        ("coalesce_steps", Annotated[int, msgspec.Meta(ge=1)], _coalesce.STEPS),
        # ... or the seconds its oldest waiting step may wait.
        ("coalesce_s", Annotated[float, msgspec.Meta(ge=0)], _coalesce.WAIT_S),
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
    return Detectors(
        (d(settings) for d, settings in chosen if settings.enabled),
        idle_forget_s=tables.idle_forget_s,
        held=Coalescer(tables.coalesce_streams, tables.coalesce_steps, tables.coalesce_s),
    )
