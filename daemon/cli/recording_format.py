"""The formats of a recording that ``vigil replay`` reads, and the format a file's name implies (pure, light)."""

from __future__ import annotations

from pathlib import Path

from trainvigil.errors import ReplayError

FORMATS: tuple[str, ...] = ("csv", "parquet", "jsonl")
"""The recording formats ``vigil replay`` reads; ``--format`` picks one when the file name does not tell."""
SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def format_of(path: str | Path, fmt: str | None = None) -> str:
    """``fmt``, or the format the file name's suffix implies."""
    if fmt:
        return fmt
    found = SUFFIXES.get(Path(path).suffix.lower())
    if found is None:
        raise ReplayError(f"cannot tell the format of {path} from its name; pass --format {'|'.join(FORMATS)}")
    return found
