"""mkdocs hook: the reference pages are generated from the code on every build, never kept by hand.

``mkdocs.yml`` names this file under ``hooks:``; ``on_files`` adds the pages of ``reference.pages()`` to
the build, so ``mkdocs build --strict`` (in ``.ci/run``) fails when a generated page links nowhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference
from mkdocs.structure.files import File, Files


def on_files(files: Files, config: Any) -> Files:
    for path, text in reference.pages().items():
        files.append(File.generated(config, path, content=text))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """The architecture page's table of import contracts, read from ``pyproject.toml``."""
    if page.file.src_uri == "architecture.md":
        markdown = markdown.replace("<!-- import-contracts -->", reference.contracts_table())
    return markdown
