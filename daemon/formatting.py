"""Print query results as a table, CSV or JSON lines; make text from the bus safe to show on a terminal."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from trainvigil.schemas.query import QueryResult
from trainvigil.schemas.terminal import terminal_safe as terminal_safe  # shared with the agent's CLI commands


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    return terminal_safe(str(value))


def _json_value(value: Any) -> Any:
    """JSON has no NaN or infinities: write them as the strings Python and JavaScript parse back."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def render(result: QueryResult, fmt: str) -> str:
    """The result as text in ``fmt``: ``table`` for a person (every name and cell through :func:`terminal_safe`),
    ``csv`` or ``json`` for programs (every character exact; JSON writes control characters as escapes)."""
    if fmt == "json":
        return "".join(
            json.dumps(dict(zip(result.columns, map(_json_value, row), strict=True)), default=str, allow_nan=False)
            + "\n"
            for row in result.rows
        )
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(result.columns)
        writer.writerows(result.rows)
        return out.getvalue()
    # Column names too: a PIVOT names columns after the data.
    columns = [terminal_safe(c) for c in result.columns]
    cells = [[_cell(v) for v in row] for row in result.rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out_lines = [line, "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |", line]
    out_lines += ["| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |" for row in cells]
    out_lines.append(line)
    footer = f"{len(result.rows)} row{'s' if len(result.rows) != 1 else ''}"
    if result.truncated:
        footer += f" ({terminal_safe(result.note) or 'row limit reached; add LIMIT or raise --limit'})"
    return "\n".join(out_lines) + "\n" + footer + "\n"
