"""Print query results as a table, CSV or JSON lines."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from trainvigil.schemas.query import QueryResult


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _json_value(value: Any) -> Any:
    """JSON has no NaN or infinities: write them as the strings Python and JavaScript parse back."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def render(result: QueryResult, fmt: str) -> str:
    """The result as text in ``fmt`` (``table``, ``csv`` or ``json``)."""
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
    cells = [[_cell(v) for v in row] for row in result.rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(result.columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out_lines = [line, "| " + " | ".join(c.ljust(w) for c, w in zip(result.columns, widths, strict=True)) + " |", line]
    out_lines += ["| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |" for row in cells]
    out_lines.append(line)
    footer = f"{len(result.rows)} row{'s' if len(result.rows) != 1 else ''}"
    if result.truncated:
        footer += f" ({result.note or 'row limit reached; add LIMIT or raise --limit'})"
    return "\n".join(out_lines) + "\n" + footer + "\n"
