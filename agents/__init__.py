"""trainvigil.agents: the in-process agent that training code embeds."""

from .agent import Agent, init
from .options import AgentOptions

__all__ = ["Agent", "AgentOptions", "init"]
