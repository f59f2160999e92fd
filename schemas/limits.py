"""What the store can hold, written once: the wire types' value limits.

Each limit is a ``msgspec.Meta`` constraint on an annotated type, so it is checked while a
message is decoded (an out-of-range value makes the whole message a dead letter with the
reason ``invalid``) and exported in the JSON Schema for producers not written in Python.
The bounds come from the DuckDB columns the values land in (``INTEGER`` is 32-bit,
``BIGINT`` 64-bit, ``TIMESTAMP`` a date) and from a documented cap on names and text.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

MIN_TIME = 0.0
"""Earliest Unix time a record may carry (1970-01-01)."""
MAX_TIME = 4_102_444_800.0
"""Latest Unix time a record may carry (2100-01-01): a clock gone wrong is a dead letter, not a crash."""
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_NAME = 256
"""Characters in a run id, host, metric name, event kind or detector name."""
MAX_TEXT = 65_536
"""Characters in a free text field (a path, an argv entry, a message)."""
MAX_FIELDS_DEPTH = 32
"""Nesting of an event's ``fields`` (dicts and lists inside each other)."""

Time = Annotated[float, msgspec.Meta(ge=MIN_TIME, le=MAX_TIME, description="Unix seconds, finite")]
Rank = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=INT32_MAX)]
Count32 = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
Count64 = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME)]
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
MAX_FRAMES = 32
Frames = Annotated[list[Annotated[str, msgspec.Meta(max_length=MAX_NAME)]], msgspec.Meta(max_length=MAX_FRAMES)]
"""A short stack sample: at most ``MAX_FRAMES`` frames of at most ``MAX_NAME`` characters."""


def fields_depth(value: Any, limit: int = MAX_FIELDS_DEPTH) -> int:
    """Nesting depth of a JSON-like value, counting stops once it passes ``limit``."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest
