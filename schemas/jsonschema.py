"""JSON Schema of the wire contract, for producers not written in Python.

The schema files in ``schemas/json/`` are generated from the Structs; a test fails when
they drift. Regenerate with ``python -m trainvigil.schemas.jsonschema``.

On the wire the payload is MessagePack: fields the schema shows as base64 strings
(``contentEncoding: base64``) are MessagePack ``bin`` values there.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from .records import RECORD_TYPES, Envelope

SCHEMA_DIR = Path(__file__).parent / "json"


def schemas() -> dict[str, dict[str, Any]]:
    """File name → JSON Schema, for the envelope and every record type."""
    out = {"envelope.schema.json": _clean(msgspec.json.schema(Envelope))}
    for record in RECORD_TYPES:
        tag = record.__struct_config__.tag
        out[f"{tag}.schema.json"] = _clean(msgspec.json.schema(record))
    return out


def _clean(node: Any) -> Any:
    """``node`` with every description's indentation removed (``inspect.cleandoc``): msgspec 0.22 kept
    a docstring's indentation and 0.23 removes it, and the files must not depend on which is installed."""
    if isinstance(node, dict):
        return {
            k: inspect.cleandoc(v) if k == "description" and isinstance(v, str) else _clean(v) for k, v in node.items()
        }
    if isinstance(node, list):
        return [_clean(v) for v in node]
    return node


def render(schema: dict[str, Any]) -> str:
    """Stable text of one schema file."""
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(directory: Path = SCHEMA_DIR) -> list[Path]:
    """Write every schema file into ``directory``; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in schemas().items():
        path = directory / name
        path.write_text(render(schema))
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_DIR):
        print(path)
