"""trainvigil.agents.gil: the GIL contention sampler (probe, attribution, report)."""

from ._report import advice, render
from .result import GilResult, ThreadResult
from .sampler import GilSampler, gil_enabled

__all__ = ["GilResult", "GilSampler", "ThreadResult", "advice", "gil_enabled", "render"]
