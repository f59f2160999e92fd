"""Text from elsewhere made safe to show on a terminal: control characters and bidi controls as escapes.

Run ids, metric names, paths and messages come from whoever publishes on the bus or writes a file the CLI
reads (a spill file's subjects, a manifest's tensor names): printed raw, an escape sequence in one retitles or
clears the terminal, and a carriage return or a bidi override makes a line read as something it is not. Agent
and daemon share this module (the agent's ``vigil push`` and ``vigil verify`` print such text too).
"""

from __future__ import annotations

__all__ = ["terminal_safe"]

_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
"""The bidirectional marks, embeddings, overrides and isolates: they reorder what a terminal shows after them."""
_ESCAPES = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))},  # C0, DEL, C1
    **{c: f"\\u{c:04x}" for c in _BIDI},
}


def terminal_safe(text: str) -> str:
    """``text`` as a terminal may show it: every control character (C0 with newline and tab, DEL, C1) and every
    bidi control written as an escape (``\\x1b``, ``\\u202e``), everything else as it is. For what a person
    reads; machine formats (JSON, CSV) keep the text exact.
    """
    return text.translate(_ESCAPES)
