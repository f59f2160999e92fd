"""The docs' reference generator (``docs/_gen/reference.py``), for the tests that check the pages it writes.

Loaded by its path, never by putting ``docs/_gen`` on ``sys.path``: that folder also holds the mkdocs hook
``hooks.py``, which would then shadow any module of that name for every module the process imports later
(which test modules those are depends on the collection order, and so on how xdist deals them out).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

GENERATOR = Path(__file__).resolve().parents[2] / "docs" / "_gen" / "reference.py"


def load_reference() -> ModuleType:
    """The generator module, loaded once per process."""
    name = "docs_reference"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, GENERATOR)
    assert spec is not None and spec.loader is not None, f"no generator at {GENERATOR}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
