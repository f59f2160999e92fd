"""The agent an integration logs through: the one the script started, or one it starts and owns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainvigil.agents._values import as_float
from trainvigil.agents.agent import Agent, current_agent, init


class Attached:
    """An agent and whether the integration started it (then it also ends the run)."""

    def __init__(self) -> None:
        self.agent: Agent | None = None
        self.owned = False

    def start(
        self,
        run_id: str | None,
        rank: int | None,
        world_size: int | None,
        config: Mapping[str, Any] | None,
        options: Mapping[str, Any],
    ) -> Agent:
        """The running agent, else a new one for this process (``world_size`` from the framework)."""
        if self.agent is None:
            running = current_agent()
            if running is not None:
                self.agent = running
            else:
                sized = dict(options) if world_size is None else {"world_size": world_size, **options}
                self.agent = init(run_id, rank, config=config, **sized)
                self.owned = True
        return self.agent

    def end(self, status: str = "ok") -> None:
        """Close the agent if the integration started it; a script's own agent is the script's to close."""
        agent, self.agent = self.agent, None
        if agent is not None and self.owned:
            agent.close(status=status)
        self.owned = False


def numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The entries of ``values`` that are real numbers (frameworks mix in strings, lists and flags)."""
    out: dict[str, float] = {}
    for name, value in values.items():
        number = None if isinstance(value, bool) else as_float(value)
        if number is not None:
            out[name] = number
    return out
