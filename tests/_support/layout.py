"""The package as installed, for the tools that read it from disk: ``python tests/_support/layout.py COMMAND...``.

The checkout keeps ``agents/``, ``daemon/`` and ``schemas/`` at the top, mapped onto ``trainvigil.agents``,
``trainvigil.daemon`` and ``trainvigil.schemas`` by the build backend (pyproject.toml's ``package-dir``). Python
follows that mapping through the editable install; tools that walk the folders (import-linter, grimp, mypy) do
not, and say "Module 'trainvigil.agents' does not exist". This builds the installed view, a copy under
``build/layout/`` (``trainvigil/`` with the three folders inside), and runs the command with it first on
``PYTHONPATH`` and ``MYPYPATH``::

    python tests/_support/layout.py lint-imports
    python tests/_support/layout.py python -m mypy -p trainvigil

``tests/static/`` checks the contracts, the import cycles and the types through the same view.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPED = ("agents", "daemon", "schemas")
"""The top-level folders that the build backend maps into ``trainvigil``."""


def build(into: Path) -> Path:
    """The installed view of the package under ``into`` (replaced if there): the folder to put on the path."""
    shutil.rmtree(into, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "src" / "trainvigil", into / "trainvigil", ignore=ignore)
    for folder in MAPPED:
        shutil.copytree(ROOT / folder, into / "trainvigil" / folder, ignore=ignore)
    return into


def environment(site: Path, *more: Path) -> dict[str, str]:
    """This process's environment with ``site`` (then ``more``) first on ``PYTHONPATH`` and ``MYPYPATH``."""
    env = dict(os.environ)
    for key in ("PYTHONPATH", "MYPYPATH"):
        env[key] = os.pathsep.join([str(site), *map(str, more), *filter(None, [env.get(key)])])
    return env


def main(argv: list[str]) -> int:
    if not argv:
        print(f"usage: python tests/_support/layout.py COMMAND [ARGS...]\n\n{__doc__}", file=sys.stderr)
        return 2
    site = build(ROOT / "build" / "layout")
    try:
        return subprocess.run(argv, cwd=ROOT, env=environment(site), check=False).returncode
    except FileNotFoundError:
        print(
            f"layout.py: {argv[0]}: command not found (pip install -e '.[dev]' installs lint-imports)", file=sys.stderr
        )
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
