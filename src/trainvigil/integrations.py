"""Framework integrations, each loaded on first use (its framework is imported then, not before):

- ``TrainerCallback``: Hugging Face ``transformers.Trainer`` (``callbacks=[TrainerCallback()]``);
- ``LightningLogger`` and ``GradNormCallback``: PyTorch Lightning;
- ``SB3Callback``: Stable-Baselines3 (``model.learn(..., callback=SB3Callback())``).

See :mod:`trainvigil.agents.integrations` and the docs' guide, ``docs/guides/integrations.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "TrainerCallback": "hf",
    "LightningLogger": "lightning",
    "GradNormCallback": "lightning",
    "SB3Callback": "sb3",
}
_EXTRA = {"hf": "transformers", "lightning": "lightning", "sb3": "stable-baselines3"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'trainvigil.integrations' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(f"trainvigil.agents.integrations.{module}")
    except ImportError as exc:
        raise ImportError(
            f"trainvigil.integrations.{name} needs {_EXTRA[module]}: pip install 'trainvigil[integrations]' ({exc})"
        ) from exc
    return getattr(loaded, name)
