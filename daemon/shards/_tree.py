"""DuckDB's own parse tree of a query (``json_serialize_sql``), read and written back (pure).

The planner never writes the tree format by hand: pieces are parsed from SQL snippets, and these
helpers read what it needs (a node's identity, an integer literal, whether a class occurs below).
"""

from __future__ import annotations

import json
from typing import Any

import duckdb

from trainvigil.errors import QueryRefusedError

_LOCATION_KEYS = frozenset({"alias", "query_location", "query_location_length"})


def parse(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any]:
    tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0])
    if tree.get("error"):
        raise QueryRefusedError(f"cannot parse the query: {tree.get('error_message', tree)}")
    if len(tree["statements"]) != 1:
        raise QueryRefusedError("one SELECT at a time")
    return tree


def to_sql(con: duckdb.DuckDBPyConnection, tree: dict[str, Any]) -> str:
    text: str = con.execute("SELECT json_deserialize_sql(?::JSON)", [json.dumps(tree)]).fetchall()[0][0]
    return text


def node_key(node: Any) -> str:
    """An expression's identity, without its alias and where it was written."""

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in _LOCATION_KEYS}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return json.dumps(strip(node), sort_keys=True)


def is_int(node: dict[str, Any]) -> int | None:
    literal = node.get("literal") if node.get("class") == "CONSTANT" else None
    if isinstance(literal, dict) and literal.get("kind") in ("INTEGER", "BIGINT") and str(literal["text"]).isdigit():
        return int(literal["text"])
    return None


def has_class(node: Any, classes: frozenset[str]) -> bool:
    if isinstance(node, dict):
        return node.get("class") in classes or any(has_class(v, classes) for v in node.values())
    if isinstance(node, list):
        return any(has_class(v, classes) for v in node)
    return False
