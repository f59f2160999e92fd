"""Calls that would make values too big to compute, refused before the query runs.

DuckDB looks for an interrupt only between vectors of 2 048 rows, and its ``memory_limit`` does not
count the strings and lists inside a vector. One call of ``repeat('x', 1e9)``, a scalar
``range(2e7)`` or ``printf('%1000000000d', 1)``, or 2 048 rows of ``repeat('x', 600000)``, thus
allocates gigabytes before the query guard can stop it. The functions whose result's size an argument
sets are listed here with that size: a query calling one is refused unless that argument is written in
the query (numbers, strings, and arithmetic on them) and a vector of such values fits in
``query_memory_bytes``. The size of a value the query does not spell out (a column, most functions'
results) is not known before it runs: where a call only copies it through it counts as
:data:`UNKNOWN_BYTES`; where a call multiplies it (``repeat(col, n)``) the call is refused.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from typing import Any

from trainvigil.errors import QueryRefusedError

VECTOR_ROWS = 2048
"""Rows DuckDB computes at once (its ``STANDARD_VECTOR_SIZE``); it cannot be interrupted within them."""
UNKNOWN_BYTES = 16
"""What a value the query does not spell out is taken to hold where it is only copied (a string header)."""
_ITEM_BYTES = 16  # a list element: a number, or a string's header
_CHAR_BYTES = 4  # UTF-8's longest character: lpad/rpad/to_base count characters, memory counts bytes
_TEXT_TYPES = frozenset({"varchar", "text", "string", "char", "bpchar", "blob", "bytea"})
_DIGITS = re.compile(r"\d+")

Value = float | str | bytes | None
"""A constant argument: a number, a string or a blob; ``None``: not written in the query."""

_OPERATORS: dict[str, Callable[[float, float], float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": math.fmod,
    "^": math.pow,
    "**": math.pow,
    "pow": math.pow,
    "power": math.pow,
}


class _NotWritten(Exception):
    """The argument that sets a result's size is not written in the query; ``args[0]`` says which and how."""


def _literal(literal: dict[str, Any]) -> Value:
    kind, text = literal.get("kind"), str(literal.get("text", ""))
    if kind in ("INTEGER", "NUMERIC"):
        try:
            return float(int(text, 0))  # 0x10, 1_000
        except ValueError:
            try:
                return float(text.replace("_", ""))
            except ValueError:
                return None
    if kind == "STRING":
        return text
    if kind == "HEX":
        return bytes(len(text) // 2)
    return None


def constant(node: Any) -> Value:
    """The value of an expression written out in the query (literals, casts, arithmetic, ``||``), else ``None``."""
    if not isinstance(node, dict):
        return None
    kind = node.get("class")
    if kind == "CONSTANT":
        return _literal(node.get("literal") or {})
    if kind == "CAST":
        value = constant(node.get("child"))
        target = str((node.get("type_expr") or {}).get("type_name", "")).lower()
        if isinstance(value, str) and target not in _TEXT_TYPES:
            try:
                return float(value)
            except ValueError:
                return None
        return value
    if kind != "FUNCTION":
        return None
    name = str(node.get("function_name", "")).lower()
    args = [constant(a.get("expression")) for a in node.get("arguments", [])]
    if name in ("||", "concat") and all(isinstance(a, str) for a in args):
        return "".join(a for a in args if isinstance(a, str))
    numbers = [a for a in args if isinstance(a, float)]
    if len(numbers) != len(args):
        return None
    try:
        if len(numbers) == 1 and name in ("+", "-"):
            return numbers[0] if name == "+" else -numbers[0]
        if len(numbers) == 2 and name in _OPERATORS:
            return _OPERATORS[name](*numbers)
    except (ZeroDivisionError, OverflowError, ValueError):
        return math.inf
    return None


def _bytes(value: Value) -> float:
    if isinstance(value, str):
        return float(len(value.encode()))
    if isinstance(value, bytes):
        return float(len(value))
    return float(_ITEM_BYTES)


def value_bytes(node: Any) -> float | None:
    """Bytes the value of ``node`` holds as far as the query says: a constant's, or a sized call's (at most);
    ``None`` when the query does not say (a column, another function's result)."""
    value = constant(node)
    if value is not None:
        return _bytes(value)
    if isinstance(node, dict) and node.get("class") == "FUNCTION":
        name = str(node.get("function_name", "")).lower()
        args = [a.get("expression") for a in node.get("arguments", [])]
        if name in ("||", "concat", "list_value"):
            sizes = [value_bytes(a) for a in args]
            return sum(s for s in sizes if s is not None) if all(s is not None for s in sizes) else None
        if name in SIZED:
            try:
                return SIZED[name](args)
            except _NotWritten:
                return None
    return None


def _number(args: list[Any], i: int, what: str) -> float:
    value = constant(args[i]) if i < len(args) else None
    if not isinstance(value, float) or math.isnan(value):
        raise _NotWritten(f"{what} must be a number written in the query")
    return value


def _repeat(args: list[Any]) -> float:
    count = _number(args, 1, "count")
    size = value_bytes(args[0]) if args else None
    if size is None:
        raise _NotWritten("value must be written in the query, not taken from a column: it is copied count times")
    return max(count, 0) * size


def _pad(args: list[Any]) -> float:
    return max(_number(args, 1, "count"), 0) * _CHAR_BYTES


def _range(inclusive: bool) -> Callable[[list[Any]], float]:
    def size(args: list[Any]) -> float:
        if not 1 <= len(args) <= 3:
            raise _NotWritten("bounds must be numbers written in the query")
        bounds = [_number(args, i, "bounds") for i in range(len(args))]
        start, stop = (0.0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
        step = bounds[2] if len(bounds) == 3 else 1.0
        if step == 0:
            return 0.0
        return max(math.floor((stop - start) / step) + (1 if inclusive else 0), 0) * _ITEM_BYTES

    return size


def _resize(args: list[Any]) -> float:
    fill = value_bytes(args[2]) if len(args) > 2 else _ITEM_BYTES
    return max(_number(args, 1, "size"), 0) * max(fill or UNKNOWN_BYTES, _ITEM_BYTES)


def _format(args: list[Any]) -> float:
    """printf/format: the widest field its format asks for (``%1000d``, ``{:>1000}``), and its arguments."""
    fmt = constant(args[0]) if args else None
    if not isinstance(fmt, str):
        raise _NotWritten("format must be a string written in the query")
    if "*" in fmt or re.search(r"\{[^}]*\{", fmt):  # a width taken from the arguments
        raise _NotWritten("field widths must be numbers written in its format")
    widest = max((float(d) for d in _DIGITS.findall(fmt)), default=0.0)
    rest = [value_bytes(a) for a in args[1:]]
    return len(fmt.encode()) + widest * (len(args) or 1) + sum(s or UNKNOWN_BYTES for s in rest)


def _optional_width(i: int, per_unit: float) -> Callable[[list[Any]], float]:
    def size(args: list[Any]) -> float:
        return max(_number(args, i, "width"), 0) * per_unit if len(args) > i else 0.0

    return size


SIZED: dict[str, Callable[[list[Any]], float]] = {
    "repeat": _repeat,
    "lpad": _pad,
    "rpad": _pad,
    "range": _range(inclusive=False),
    "generate_series": _range(inclusive=True),
    "list_resize": _resize,
    "array_resize": _resize,
    "printf": _format,
    "format": _format,
    "to_base": _optional_width(2, _CHAR_BYTES),
    "bitstring": _optional_width(1, 1 / 8),
    "equi_width_bins": _optional_width(2, _ITEM_BYTES),
}
"""Scalar functions whose result's size (bytes, at most) an argument sets, by name."""

_HINTS = {
    "range": "; to make rows, use FROM range(...)",
    "generate_series": "; to make rows, use FROM generate_series(...)",
    "repeat": "; for a bar chart, use bar()",
}


def _calls(tree: Any) -> list[dict[str, Any]]:
    """Every scalar call of a :data:`SIZED` function in ``tree`` (not ``FROM range(...)``: a table function
    makes rows, vector by vector)."""
    found: list[dict[str, Any]] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.get("type") == "TABLE_FUNCTION" and isinstance(node.get("function"), dict):
                stack.extend(node["function"].get("arguments", []))
                stack.extend(v for k, v in node.items() if k != "function")
                continue
            if node.get("class") == "FUNCTION" and str(node.get("function_name", "")).lower() in SIZED:
                found.append(node)
            stack.extend(node.values())
    return found


def size_refusal(tree: Any, memory_bytes: int) -> QueryRefusedError | None:
    """Why a statement's JSON parse tree calls a function whose values could outgrow ``memory_bytes`` before the
    query guard can interrupt it, or ``None``."""
    most = memory_bytes / VECTOR_ROWS
    for call in _calls(tree):
        name = str(call["function_name"]).lower()
        hint = _HINTS.get(name, "")
        try:
            size = SIZED[name]([a.get("expression") for a in call.get("arguments", [])])
        except _NotWritten as exc:
            return QueryRefusedError(
                f"{name}()'s {exc.args[0]}, so the size of its result is known before it runs "
                f"(query_memory_bytes){hint}"
            )
        if size > most:
            return QueryRefusedError(
                f"{name}() would make values of up to {_shown(size)}; DuckDB computes {VECTOR_ROWS} rows at once, "
                f"and {VECTOR_ROWS} such values pass query_memory_bytes ({_shown(memory_bytes)}, at most "
                f"{_shown(most)} a value): ask for less, or raise query_memory_bytes{hint}"
            )
    return None


def _shown(size: float) -> str:
    if not math.isfinite(size):
        return "more bytes than can be counted"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:.0f} bytes"
