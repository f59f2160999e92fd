"""The architecture holds: import-linter's contracts in pyproject.toml, and no import cycle."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import layout
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    """Through the command contributors run (``python tests/_support/layout.py lint-imports``)."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[dev]'")
    command = [sys.executable, str(ROOT / "tests" / "_support" / "layout.py"), lint, "--no-cache"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


_CYCLES = """
import grimp
graph = grimp.build_graph("trainvigil", cache_dir=None)
assert "trainvigil.daemon.app" in graph.modules, "the installed layout was not found"
for a in sorted(graph.modules):
    for b in sorted(graph.find_modules_directly_imported_by(a)):
        if a < b and graph.chain_exists(importer=b, imported=a):
            print(a, "<->", b)
"""


def test_the_package_has_no_import_cycle(tmp_path: Path) -> None:
    """Module pairs that reach each other, counting imports inside functions too."""
    pytest.importorskip("grimp")
    env = layout.environment(layout.build(tmp_path / "site"))
    done = subprocess.run([sys.executable, "-c", _CYCLES], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "", f"import cycles:\n{done.stdout}"


@pytest.mark.timeout(600)  # mypy over the package, tests, benches and examples, cold: ~45 s alone, more when loaded
def test_the_package_tests_benches_and_examples_type_check(tmp_path: Path) -> None:
    """mypy over the installed layout, with pyproject.toml's settings (the folders alone would not resolve
    ``trainvigil.*`` imports, and mypy would take them as Any), and over ``tests/``, ``bench/`` and
    ``examples/`` against it (their helper modules, ``support`` and ``_procs``, found as the tests find them)."""
    pytest.importorskip("mypy")
    site = layout.build(tmp_path / "site")
    env = layout.environment(site, ROOT / "tests" / "_support", ROOT / "bench")
    mypy = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    mypy += ["--cache-dir", str(tmp_path / "cache"), "--explicit-package-bases"]
    files = sorted(str(p) for folder in ("tests", "bench", "examples") for p in (ROOT / folder).rglob("*.py"))
    # A tier's own conftest.py is one more module named ``conftest``: each is checked in a run of its own (the
    # cache of the first makes those cheap).
    nested = [f for f in files if f.endswith("conftest.py") and Path(f).parent != ROOT / "tests"]
    runs = [[str(site / "trainvigil"), *(f for f in files if f not in nested)], *([f] for f in nested)]
    for targets in runs:
        done = subprocess.run([*mypy, *targets], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
