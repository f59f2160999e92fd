"""Which optimizers a benchmark runs: the built-in five, or any ``torch.optim.Optimizer`` by ``module:Class``.

An :class:`OptimizerSpec` names a class, its keyword arguments (besides ``lr``) and the factor its
peak LR takes of the workload's base LR (AdamW's: Lion and Sophia step each coordinate by up to
``lr``, so they take a smaller one). Every optimizer gets the same decoupled ``weight_decay``
unless its kwargs say otherwise.
"""

from __future__ import annotations

import importlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

WEIGHT_DECAY = 0.01


class SpecError(ValueError):
    """An optimizer that cannot be built as asked; the message says what to change."""


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer to benchmark.

    Attributes:
        name: its name in run ids and tables (a subject-safe token).
        target: ``module:Class``.
        kwargs: keyword arguments besides ``lr`` (JSON-like).
        lr_factor: peak LR = ``lr_factor`` x the workload's base LR, unless ``lr`` is given.
        lr: a fixed peak LR for every workload (``--lr``).
        lr_kwargs: other keyword arguments that take the same peak LR (Muon's ``adamw_lr``).
    """

    name: str
    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    lr_factor: float = 1.0
    lr: float | None = None
    lr_kwargs: tuple[str, ...] = ()

    def peak_lr(self, base: float) -> float:
        return self.lr if self.lr is not None else base * self.lr_factor

    def build(self, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
        """The optimizer over ``params`` with peak ``lr`` (the schedule scales each group's from there)."""
        cls = load(self.target)
        kwargs = {"weight_decay": WEIGHT_DECAY, **dict.fromkeys(self.lr_kwargs, lr), **self.kwargs}
        try:
            return cls(params, lr=lr, **kwargs)  # type: ignore[call-arg]  # every optimizer we run takes lr
        except TypeError as error:
            raise SpecError(f"{self.target}({', '.join(kwargs)}) cannot be built: {error}") from None


def load(target: str) -> type[torch.optim.Optimizer]:
    """The class ``module:Class`` names; it must be a ``torch.optim.Optimizer`` subclass."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SpecError(f"--optim {target!r}: write module:Class, e.g. torch.optim:AdamW")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise SpecError(f"--optim {target!r}: {error}") from None
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise SpecError(f"--optim {target!r} is not a torch.optim.Optimizer subclass")
    return cls


BUILTINS: dict[str, OptimizerSpec] = {
    s.name: s
    for s in (
        OptimizerSpec("adamw", "torch.optim:AdamW", {"foreach": True}),
        OptimizerSpec("lion", "trainvigil.optim:Lion", lr_factor=0.3),
        OptimizerSpec("adan", "trainvigil.optim:Adan"),
        OptimizerSpec("sophia", "trainvigil.optim:SophiaG", {"rho": 0.04, "update_every": 10}, lr_factor=0.3),
        OptimizerSpec("muon", "trainvigil.optim:Muon", {"adjust_lr_fn": "match_rms_adamw"}, lr_kwargs=("adamw_lr",)),
    )
}
"""The default line-up; AdamW is the baseline every other is tested against."""
BASELINE = "adamw"


def from_flag(target: str, kwargs: dict[str, Any], lr: float | None) -> OptimizerSpec:
    """A spec from ``--optim`` (a built-in name or ``module:Class``) and its kwargs."""
    if target in BUILTINS:
        base = BUILTINS[target]
        return OptimizerSpec(base.name, base.target, {**base.kwargs, **kwargs}, base.lr_factor, lr, base.lr_kwargs)
    load(target)  # fail now, not after the first workload
    name = target.rpartition(":")[2].lower()
    return OptimizerSpec(name, target, kwargs, 1.0, lr)


def parse_kwargs(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value is read as JSON when it parses (numbers, lists, true), else a string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError(f"--kw {pair!r}: write key=value, e.g. --kw betas=[0.9,0.99]")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    if "betas" in out and isinstance(out["betas"], list):
        out["betas"] = tuple(out["betas"])
    return out


def from_toml(path: Path) -> list[OptimizerSpec]:
    """Specs from a TOML file: ``[[optim]]`` tables with ``target``, optional ``name``, ``lr``, ``lr_factor``
    and a ``[optim.kwargs]`` table::

        [[optim]]
        target = "mypkg.opt:MyOpt"
        lr = 3e-4
        kwargs = { betas = [0.9, 0.95] }
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise SpecError(f"--optim-config {path}: {error}") from None
    specs = []
    for entry in data.get("optim", []):
        if "target" not in entry:
            raise SpecError(f'--optim-config {path}: each [[optim]] needs target = "module:Class"')
        kwargs = dict(entry.get("kwargs", {}))
        if isinstance(kwargs.get("betas"), list):
            kwargs["betas"] = tuple(kwargs["betas"])
        spec = from_flag(entry["target"], kwargs, entry.get("lr"))
        factor = float(entry.get("lr_factor", spec.lr_factor))
        name = entry.get("name", spec.name)
        specs.append(OptimizerSpec(name, spec.target, spec.kwargs, factor, spec.lr, spec.lr_kwargs))
    if not specs:
        raise SpecError(f"--optim-config {path} names no optimizer: add [[optim]] tables")
    return specs
