"""trainvigil.agents: the in-process agent that training code embeds."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .agent import Agent, init
    from .options import AgentOptions

__all__ = ["Agent", "AgentOptions", "init"]

# Loaded on first use, not with the package: a process that imports one of the agent's modules (the CLI
# imports ``verify`` and ``spill.push``) does not load the agent's worker and transport with it.
_LAZY_NAMES = {"Agent": ".agent", "init": ".agent", "AgentOptions": ".options"}


def __getattr__(name: str) -> object:
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name], __name__), name)
        globals()[name] = value  # looked up once: later reads are plain attribute reads
        return value
    raise AttributeError(f"module 'trainvigil.agents' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
