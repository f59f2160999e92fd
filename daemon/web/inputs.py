"""Which detector each metric a run logged feeds: the run page's table "logged name → detector input".

A detector stays silent when nothing it reads arrives: a script that logs ``my/objective`` feeds no detector
until that name is mapped (``wandb.init(names={"my/objective": "loss"})``). The table is computed from the
mapping the drop-ins log through (:mod:`trainvigil.schemas.names`, with the run's own ``names=`` from its
``compat_names`` event) and from the metrics each registered detector reads with its default settings (a
daemon configured with ``[detectors.<name>] metric = ...`` reads another name than the table says).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from trainvigil.daemon.detectors import REGISTRY
from trainvigil.schemas.names import detector_name


def reads(detector: type[Any]) -> tuple[str, ...]:
    """The metrics ``detector`` reads by default: its settings' ``metric``, ``train_metric`` and ``metrics``, then
    the names it declares in its ``reads``."""
    settings = detector.Settings()
    found = [getattr(settings, key, None) for key in ("metric", "train_metric")]
    found += [*getattr(settings, "metrics", ()), *getattr(detector, "reads", ())]
    return tuple(dict.fromkeys(name for name in found if isinstance(name, str) and name))


@cache
def readers() -> Mapping[str, tuple[str, ...]]:
    """Each metric name the registered detectors read -> those detectors, in registry order."""
    found: dict[str, list[str]] = {}
    for detector in REGISTRY:
        for metric in reads(detector):
            found.setdefault(metric, []).append(detector.name)
    return {metric: tuple(names) for metric, names in found.items()}


def feeds(logged: Sequence[str], names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """A row per logged name: ``name``, the detector ``input`` it feeds (``None``: no detector reads it),
    ``negated`` (fed as minus its value) and the ``detectors`` that read that input. The detectors' copy of
    a mapped name (``loss`` beside ``train/loss``) has no row of its own: its alias's row says it."""
    read_by = readers()
    plans = {name: detector_name(name, names) for name in logged}
    copies = {target for target, _ in plans.values() if target is not None}
    rows = []
    for name in logged:
        target, negated = plans[name]
        if target is None and name in copies:
            continue
        detectors = read_by.get(target or name, ())
        fed = target is not None or bool(detectors)
        rows.append({"name": name, "input": (target or name) if fed else None, "negated": negated,
                     "detectors": list(detectors)})  # fmt: skip
    return rows


def unfed(logged: Sequence[str]) -> list[dict[str, Any]]:
    """The registered detectors that read metrics, none of which the run logged: why they are silent."""
    present = set(logged)
    return [
        {"detector": detector.name, "reads": list(wanted)}
        for detector in REGISTRY
        if (wanted := reads(detector)) and present.isdisjoint(wanted)
    ]
