"""Run every check of the project: the tests in parallel, then the serial group alone, with the static checks beside.

    python tests/run.py                      # everything, as CI runs it
    python tests/run.py tests/unit -k config # only these (the parallel part, then their serial ones); no static checks

Steps:

- **tests**: ``pytest -n WORKERS --dist loadgroup -m "not serial"`` over ``tests/unit``, ``tests/integration`` and
  ``tests/e2e`` (pytest-xdist; every server a test starts takes a free port and a temporary directory). The tests
  that share a module-scoped fixture (a daemon, a cluster, a batch of CLIs) stay on one worker, which builds it once
  (tests/conftest.py groups them); the others are dealt out one by one.
- **serial**: ``pytest -m serial``, alone once the parallel part is done: guards against blocking and measurements
  that a loaded machine would upset.
- **static** (a full run only), started first at a lower priority so the tests keep the cores: ``ruff check``,
  ``ruff format --check``, ``pytest tests/static`` (import contracts, no import cycle, mypy over the package, tests,
  benchmarks and examples, the wheel) and ``mkdocs build --strict`` (the docs site).

Workers: ``VIGIL_TEST_WORKERS`` (default: twice the cores, at least 2: most tests wait on a broker or a child
process). The exit status is 0 only when every step passed; a table of the steps' times and results comes last.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIERS = ["tests/unit", "tests/integration", "tests/e2e"]
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:benchmark"]
NO_TESTS = 5
"""pytest's exit status when the selection holds no test (``-k`` that matches no serial test): not a failure."""


@dataclass
class Step:
    """One command of the run: started at once (``background``) or in its turn."""

    name: str
    command: list[str]
    background: bool = False
    started: float = 0.0
    seconds: float = 0.0
    status: int | None = None
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = field(default=None, repr=False)
    timer: threading.Thread | None = field(default=None, repr=False)

    def start(self, logs: Path) -> None:
        self.started = time.monotonic()
        if self.background:
            self.log = logs / f"{self.name.replace(' ', '-')}.log"
            with open(self.log, "wb") as out:
                self.process = subprocess.Popen(
                    self.command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_lower_priority
                )
            # Timed when it ends, not when the run gets round to asking.
            self.timer = threading.Thread(target=self._finish, daemon=True)
            self.timer.start()
        else:
            self.process = subprocess.Popen(self.command, cwd=ROOT)

    def _finish(self) -> None:
        assert self.process is not None
        status = self.process.wait()
        self.seconds = time.monotonic() - self.started
        self.status = 0 if status == NO_TESTS and self.name in ("tests", "serial") else status

    def wait(self) -> int:
        if self.timer is not None:
            self.timer.join()
        else:
            self._finish()
        assert self.status is not None
        if self.log is not None and self.status != 0:
            print(f"\n==== {self.name} failed (exit {self.status}); its output:", flush=True)
            sys.stdout.write(self.log.read_text(errors="replace")[-20_000:])
        return self.status


def _lower_priority() -> None:
    os.nice(10)


def workers() -> int:
    given = os.environ.get("VIGIL_TEST_WORKERS", "")
    if given:
        if not given.isdigit() or int(given) < 1:
            raise SystemExit(f"VIGIL_TEST_WORKERS={given!r}: give a number of workers, 1 or more")
        return int(given)
    return max(2, 2 * (os.cpu_count() or 1))


def steps(args: list[str], scratch: Path) -> list[Step]:
    chosen = args or TIERS
    plan = [
        Step(
            "tests",
            [*PYTEST, "-n", str(workers()), "--dist", "loadgroup", "-m", "not serial", "--durations=25", *chosen],
        ),
        Step("serial", [*PYTEST, "-m", "serial", "--durations=10", *chosen]),
    ]
    if args:
        return plan
    static = [
        Step("ruff check", [sys.executable, "-m", "ruff", "check", "."], background=True),
        Step("ruff format", [sys.executable, "-m", "ruff", "format", "--check", "."], background=True),
        Step("static", [*PYTEST, "-q", "tests/static"], background=True),
        Step("docs", [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(scratch / "site")], True),
    ]
    return static + plan


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="vigil-checks-") as scratch:
        logs = Path(scratch)
        plan = steps(argv, logs)
        for step in plan:
            if step.background:
                step.start(logs)
        for step in plan:
            if not step.background:
                step.start(logs)
                step.wait()
        for step in plan:
            if step.background:
                step.wait()
    print("\n step         seconds  result")
    for step in plan:
        print(f" {step.name:<12} {step.seconds:7.1f}  {'passed' if step.status == 0 else f'FAILED ({step.status})'}")
    return 0 if all(step.status == 0 for step in plan) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
