"""trainvigil: observability for ML training.

Two lines in a training script::

    import trainvigil
    vigil = trainvigil.init()            # VIGIL_NATS_URL, VIGIL_RUN_ID, RANK... from the env
    vigil.log(step, loss=loss, lr=lr)    # never blocks, never raises
"""

import importlib
from typing import TYPE_CHECKING

from trainvigil._version import __version__
from trainvigil.errors import VigilError

if TYPE_CHECKING:
    from trainvigil.agents import Agent, init

__all__ = ["Agent", "VigilError", "__version__", "init"]

# The agent's names load on first use: every ``trainvigil.*`` import runs this file first, and the daemon's
# processes (``vigil up``, the CLI) must not pay for the agent's worker and transport they never run.
_LAZY_NAMES = {"Agent": "trainvigil.agents", "init": "trainvigil.agents"}
# Subpackages a script reaches as attributes (``trainvigil.torch.watch(...)``), imported on first use too:
# torch (or jax, or a framework) stays unimported for scripts that never touch it.
_LAZY_MODULES = frozenset({"agents", "schemas", "torch", "checkpoint", "jax", "integrations", "wandb", "tensorboard"})


def __getattr__(name: str) -> object:
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
        globals()[name] = value  # looked up once: later reads are plain attribute reads
        return value
    if name in _LAZY_MODULES:
        return importlib.import_module(f"trainvigil.{name}")
    raise AttributeError(f"module 'trainvigil' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
