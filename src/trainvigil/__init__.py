"""trainvigil: observability for ML training.

Two lines in a training script::

    import trainvigil
    vigil = trainvigil.init()            # VIGIL_NATS_URL, VIGIL_RUN_ID, RANK... from the env
    vigil.log(step, loss=loss, lr=lr)    # never blocks, never raises
"""

from trainvigil._version import __version__
from trainvigil.agents import Agent, init
from trainvigil.errors import VigilError

__all__ = ["Agent", "VigilError", "__version__", "init"]


def __getattr__(name: str) -> object:
    # ``trainvigil.torch``, ``.checkpoint``, ``.jax``, ``.integrations`` and the W&B / TensorBoard shims load
    # on first use: torch (or jax, or a framework) stays unimported for scripts that never touch it.
    if name in ("torch", "checkpoint", "jax", "integrations", "wandb", "tensorboard"):
        import importlib

        return importlib.import_module(f"trainvigil.{name}")
    raise AttributeError(f"module 'trainvigil' has no attribute {name!r}")
