"""Streaming anomaly detectors: the seam between decoding and storing.

A detector is a small class: settings (a :class:`DetectorSettings` subclass, ``Settings``)
in ``__init__``, work in ``__call__``, which sees every decoded batch once, in stream order,
and returns the alert updates it raises (see :class:`~._base.Episodes`). State is per
(run, rank) with bounded memory, dropped when ``run_all`` says a stream or run is over
(``forget``, ``forget_run``). Adding one means one module, its ``Settings`` in ``_settings`` (a table of
``DetectorsConfig``) and one line in ``REGISTRY``; its settings then appear in the daemon configuration as
``[detectors.<name>]`` (TOML) and ``VIGIL_DETECTORS_<NAME>_<KEY>`` (environment), ``enabled = false`` leaving it
out. The settings live apart from the detectors so that reading the configuration needs no NumPy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainvigil.daemon.detectors._settings import DetectorsConfig, DetectorSettings

if TYPE_CHECKING:
    from trainvigil.daemon.detectors._base import Detector, Episodes, Finding, StreamDetector
    from trainvigil.daemon.detectors._isolation import DetectorFailures, select_runs
    from trainvigil.daemon.detectors._registry import REGISTRY, build
    from trainvigil.daemon.detectors._runner import Detectors, run_all

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

_LOADED_WITH_THE_DETECTORS = {
    "Detector": "_base",
    "Episodes": "_base",
    "Finding": "_base",
    "StreamDetector": "_base",
    "DetectorFailures": "_isolation",
    "select_runs": "_isolation",
    "REGISTRY": "_registry",
    "build": "_registry",
    "Detectors": "_runner",
    "run_all": "_runner",
}
"""Names imported on first use: the settings (``DetectorsConfig``, which the daemon's configuration and so every
``vigil`` command reads) load with msgspec alone, the detectors with NumPy."""


def __getattr__(name: str) -> Any:
    module = _LOADED_WITH_THE_DETECTORS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
