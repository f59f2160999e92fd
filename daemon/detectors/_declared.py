"""What a run declares about itself in its ``run_start`` config (``trainvigil.init(config={...})``).

Detectors read one key each (``val_metric``, ``eval_metric``, ``target_kl``): a name or a number
the user knows better than any default. Kept per run until the run is forgotten.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from trainvigil.daemon.batch.decode import IngestBatch

T = TypeVar("T")


def a_name(value: object) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def a_positive_number(value: object) -> float | None:
    """A number above 0 (not a bool), as a float, else None."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None  # type: ignore[arg-type]


class Declared(Generic[T]):
    """``key`` of every run's ``run_start`` config, as ``parse`` accepts it (None: not declared)."""

    def __init__(self, key: str, parse: Callable[[object], T | None]) -> None:
        self.key, self.parse = key, parse
        self._by_run: dict[str, T] = {}

    def note(self, batch: IngestBatch) -> None:
        for source, start in batch.run_starts:
            value = self.parse(start.config.get(self.key)) if isinstance(start.config, dict) else None
            if value is not None:
                self._by_run[source.run_id] = value

    def get(self, run_id: str, default: T) -> T:
        return self._by_run.get(run_id, default)

    def forget(self, run_id: str) -> None:
        self._by_run.pop(run_id, None)
