"""Streaming anomaly detectors: the seam between decoding and storing.

A detector is a small callable built from the configuration, fed every decoded batch in
stream order, returning the anomalies it raises (structlog-style processors, composed as
a list). Adding one means adding a module and one line in ``REGISTRY``; the detectors
themselves arrive with their own issue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from trainvigil.schemas import Anomaly

from ..config import DaemonConfig
from ..decode import IngestBatch


class Detector(Protocol):
    """Per-(run, rank) state with bounded memory; ``__call__`` sees each batch once."""

    name: str

    def __call__(self, batch: IngestBatch) -> list[Anomaly]: ...


REGISTRY: list[Callable[[DaemonConfig], Detector]] = []
"""Factories of the detectors every daemon runs, in order."""


def build(config: DaemonConfig) -> list[Detector]:
    return [factory(config) for factory in REGISTRY]


def run_all(detectors: list[Detector], batch: IngestBatch) -> list[Anomaly]:
    """Every detector's anomalies for ``batch``, in registry order."""
    found: list[Anomaly] = []
    for detector in detectors:
        found.extend(detector(batch))
    return found
