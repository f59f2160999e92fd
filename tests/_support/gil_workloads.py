"""Reference workloads with known GIL behaviour, for tests, benchmarks and canaries.

Run one under the sampler and print the result as JSON::

    OPENBLAS_NUM_THREADS=1 python tests/_support/gil_workloads.py python --seconds 1.5

numpy reads ``OPENBLAS_NUM_THREADS`` when it loads, and ``trainvigil`` loads numpy, so set
it in the environment (not in code) for the ``matmul``/``fft``/``mixed`` workloads.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from collections.abc import Callable

import msgspec

Start = Callable[[threading.Event], list[threading.Thread]]


def _spin(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(200):
            x += i * i


def _sleeper(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.001)


def _sorter(stop: threading.Event) -> None:
    # Shuffled floats: one sorted() call holds the GIL for 25-40 ms on any core (a presorted list sorts in
    # linear time, and on a fast core its call fell under the 15 ms tail the test looks for); the pause
    # after it keeps the held share near 0.3, so the median wait stays that of a free GIL.
    data = random.Random(0).sample(range(10**9), 300_000)
    while not stop.is_set():
        sorted(data)
        stop.wait(0.08)


def _matmul(stop: threading.Event) -> None:
    import numpy as np

    a = np.random.default_rng(0).random((256, 256))
    while not stop.is_set():
        a @ a


def _fft(stop: threading.Event) -> None:
    import numpy as np

    x = np.random.default_rng(0).random(1 << 16) + 0j
    while not stop.is_set():
        np.fft.fft(x)


def _pipe_io(stop: threading.Event) -> list[tuple[str, Callable[[], None]]]:
    r, w = os.pipe()

    def writer() -> None:
        while not stop.wait(0.001):
            os.write(w, b"x" * 64)
        os.close(w)

    def reader() -> None:
        while os.read(r, 4096):
            pass
        os.close(r)

    return [("pipe-writer", writer), ("pipe-reader", reader)]


def _threads(stop: threading.Event, *named: tuple[str, Callable[[threading.Event], object]]) -> list[threading.Thread]:
    out = [threading.Thread(target=f, args=(stop,), name=n, daemon=True) for n, f in named]
    for t in out:
        t.start()
    return out


def _pipe(stop: threading.Event) -> list[threading.Thread]:
    out = [threading.Thread(target=f, name=n, daemon=True) for n, f in _pipe_io(stop)]
    for t in out:
        t.start()
    return out


WORKLOADS: dict[str, Start] = {
    "idle": lambda stop: _threads(stop, ("idle", lambda s: s.wait())),
    "sleep": lambda stop: _threads(stop, ("sleeper", _sleeper)),
    "pipe": _pipe,
    "matmul": lambda stop: _threads(stop, ("matmul", _matmul)),
    "fft": lambda stop: _threads(stop, ("fft", _fft)),
    "python": lambda stop: _threads(stop, ("python-0", _spin)),
    "python4": lambda stop: _threads(stop, *[(f"python-{i}", _spin) for i in range(4)]),
    "sorted": lambda stop: _threads(stop, ("sorter", _sorter)),
    "mixed": lambda stop: _threads(
        stop, ("python-0", _spin), ("idle", lambda s: s.wait()), ("matmul", _matmul), ("fft", _fft)
    ),
}
"""Name → start the workload's threads (they run until the event is set)."""


def run(name: str, seconds: float, *, sample: bool = True, warmup: float = 0.2) -> dict[str, object]:
    """Run workload ``name`` for ``seconds`` (after ``warmup``), measured by the sampler if ``sample``."""
    from trainvigil.agents.gil.sampler import GilSampler

    stop = threading.Event()
    threads = WORKLOADS[name](stop)
    time.sleep(warmup)
    sampler = GilSampler(float("inf"), name=name).start() if sample else None
    time.sleep(seconds)
    result = sampler.stop() if sampler is not None else None
    stop.set()
    for t in threads:
        t.join(5)
    return {
        "workload": name,
        "result": result,
        "threads": {t.name: t.ident for t in threads},
        "pid": os.getpid(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--warmup", type=float, default=0.2)
    parser.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (seconds)")
    parser.add_argument("--no-sampler", action="store_true", help="run the workload only (for an outside profiler)")
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    out = run(args.workload, args.seconds, sample=not args.no_sampler, warmup=args.warmup)
    sys.stdout.write(msgspec.json.encode(out).decode() + "\n")


if __name__ == "__main__":
    main()
