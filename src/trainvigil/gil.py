"""Find GIL contention in a block of code or a function.

::

    from trainvigil.gil import detect_gil_contention, profile_gil

    with detect_gil_contention("data loading") as probe:
        run_the_threads()
    probe.result.held, probe.result.wait_p99, probe.result.threads

    @profile_gil
    def train_epoch(): ...
    train_epoch()
    train_epoch.gil_result.held

Both print a report (per-thread bars, GIL hold share, p50/p99 wait, hot functions and advice)
to stderr. Continuous sampling inside a training run: ``trainvigil.init(gil=True)``.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, ParamSpec, TypeVar, overload

from trainvigil.agents.gil import GilResult, GilSampler, ThreadResult, advice, render

P = ParamSpec("P")
R = TypeVar("R")


class Contention:
    """What ``detect_gil_contention`` yields: ``result`` is filled in when the block exits."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.result: GilResult | None = None


@contextmanager
def detect_gil_contention(
    name: str = "block", *, report: bool = True, file: IO[str] | None = None, attribution_hz: float = 10.0
) -> Iterator[Contention]:
    """Measure GIL contention while the block runs.

    Args:
        name: names the block in the report.
        report: print the report when the block exits (to ``file``, default stderr).
        attribution_hz: per-thread attribution ticks a second (at most 20; 0: probe only).

    Yields a :class:`Contention` whose ``result`` (:class:`GilResult`) holds the numbers.
    """
    found = Contention(name)
    sampler = GilSampler(math.inf, attribution_hz=attribution_hz, name=name).start()
    try:
        yield found
    finally:
        found.result = sampler.stop()
        if report and found.result is not None:
            print(render(found.result), file=file or sys.stderr, flush=True)


@overload
def profile_gil(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def profile_gil(*, report: bool = True, file: IO[str] | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def profile_gil(func: Callable[..., Any] | None = None, /, *, report: bool = True, file: IO[str] | None = None) -> Any:
    """Decorator: measure GIL contention during each call and print the report.

    The function's return value is unchanged; the latest call's :class:`GilResult` is on
    ``wrapper.gil_result``. Use bare (``@profile_gil``) or with options
    (``@profile_gil(report=False)``).
    """

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            found = Contention(f.__qualname__)
            try:
                with detect_gil_contention(f.__qualname__, report=report, file=file) as found:
                    return f(*args, **kwargs)
            finally:
                wrapper.gil_result = found.result  # type: ignore[attr-defined]

        wrapper.gil_result = None  # type: ignore[attr-defined]
        return wrapper

    return decorate if func is None else decorate(func)


__all__ = ["Contention", "GilResult", "ThreadResult", "advice", "detect_gil_contention", "profile_gil", "render"]
