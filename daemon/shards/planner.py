"""Split one read-only query into what every shard runs and what runs over their answers (pure).

Each shard holds whole runs, so everything *inside* a query (its FROM, joins, WHERE, CTEs) is
answered by each shard on its own; only the top of the query mixes shards: the rows it returns, the
aggregates over them, DISTINCT, ORDER BY and LIMIT. The plan pushes everything it can to the shards
and finishes in an in-memory DuckDB over their answers (a table named ``partials``):

* **rows** (no aggregate at the top): each shard runs the query with its ORDER BY and with
  ``LIMIT limit+offset`` (plus the ORDER BY expressions as hidden columns); the merge orders the union
  again and applies LIMIT/OFFSET.
* **partial aggregates** (``count``, ``sum``, ``min``, ``max``, ``avg``, ``any_value``, ``bool_and``,
  ``bool_or``, with GROUP BY on any expressions): each shard returns its groups' partial states
  (``avg`` as a sum and a count); the merge combines them per group, then applies HAVING, ORDER BY,
  LIMIT. ``select count(*) from steps`` moves one row per shard.
* **inner rows** (any other aggregate: ``median``, ``count(DISTINCT x)``, ``string_agg``...): each
  shard returns the group keys and the aggregates' inputs (``DISTINCT`` ones when every aggregate is
  insensitive to duplicates), and the merge runs the aggregates. Exact, but bounded by the row limit:
  a cut shard answer makes the merged answer say ``truncated``.

What is pushed down runs on each shard over its own runs only: a subquery that aggregates a whole
table (``WHERE loss > (SELECT avg(loss) FROM steps)``) sees one shard's rows; per-run subqueries
(correlated on ``run_id``) are exact.

Refused, with what to write instead: window functions and QUALIFY at the top (a window would see
one shard's rows), GROUPING SETS/ROLLUP/CUBE, set operations at the top, and subqueries an aggregate
query would have to evaluate over the merged answer. The parse tree is DuckDB's own (``json_serialize_sql``); pieces of
SQL are built by parsing small snippets, so the tree format is never written by hand.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from trainvigil.daemon.sandbox import sandboxed
from trainvigil.daemon.shards._tree import has_class, is_int, node_key, parse, to_sql
from trainvigil.errors import QueryRefusedError
from trainvigil.schemas.sqltypes import quote_identifier as _quote

PARTIALS = "partials"
"""The table the shards' answers are loaded into for the merge query."""

_PARTIAL_FUNCS = {
    "count_star": "CAST(sum({0}) AS BIGINT)",
    "count": "CAST(sum({0}) AS BIGINT)",
    "sum": "sum({0})",
    "min": "min({0})",
    "max": "max({0})",
    "any_value": "any_value({0})",
    "arbitrary": "any_value({0})",
    "first": "any_value({0})",
    "bool_and": "bool_and({0})",
    "bool_or": "bool_or({0})",
}
_AVERAGES = frozenset({"avg", "mean"})
_DUPLICATE_BLIND = frozenset({"min", "max", "any_value", "arbitrary", "first", "bool_and", "bool_or"})


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """What every shard runs, what runs over the ``partials`` of their answers, and how they are bounded.

    Attributes:
        shard_sql: the query each shard answers.
        merge_sql: the query over ``partials`` (their answers, concatenated) that gives the answer.
        mode: ``rows``, ``partial`` or ``inner`` (see the module's docstring).
        shard_limit_follows_user: each shard gets the user's row limit (``rows``: a shard never needs
            more); otherwise the daemon's own, since the merge needs every group or row.
    """

    shard_sql: str
    merge_sql: str
    mode: str
    shard_limit_follows_user: bool


class _Inner(Exception):
    """Internal: an aggregate that partial states cannot combine; plan with inner rows instead."""


class _Planner:
    def __init__(self, sql: str, source: str = PARTIALS) -> None:
        self.con = sandboxed()  # it runs SQL functions over text given on the command line
        self.tree = parse(self.con, sql)
        self.node: dict[str, Any] = self.tree["statements"][0]["node"]
        self.source = source
        """What the merge query reads: the ``partials`` table, or one column of it unnested."""

    def expr(self, sql: str) -> dict[str, Any]:
        """The parse tree of one expression written as SQL."""
        item: dict[str, Any] = parse(self.con, f"SELECT {sql}")["statements"][0]["node"]["select_list"][0]
        return item

    def with_node(self, node: dict[str, Any]) -> str:
        tree = copy.deepcopy(self.tree)
        tree["statements"][0]["node"] = node
        return to_sql(self.con, tree)

    def name_of(self, item: dict[str, Any]) -> str:
        """The column name DuckDB gives a select item."""
        if item.get("alias"):
            return str(item["alias"])
        if item.get("class") == "COLUMN_REF":
            return str(item["column_names"][-1])
        node = parse(self.con, "SELECT 1")["statements"][0]["node"]
        node["select_list"] = [{**item, "alias": ""}]
        return self.with_node(node).removeprefix("SELECT ")

    def plan(self) -> ShardPlan:
        node = self.node
        if node.get("type") != "SELECT_NODE":
            raise QueryRefusedError(
                "across shards a query's top must be one SELECT; wrap a UNION or VALUES as "
                "SELECT * FROM (...) to concatenate the shards' answers"
            )
        if node.get("qualify") is not None or has_class(node.get("select_list"), frozenset({"WINDOW"})):
            raise QueryRefusedError(
                "window functions at the top of a query would see one shard's rows only; compute them in a "
                "subquery partitioned by run_id (each run lives on one shard), or per shard"
            )
        if (node.get("from_table") or {}).get("type") == "EMPTY":
            return self._scalars()
        aggregated = bool(node.get("group_expressions")) or node.get("having") is not None
        aggregated = aggregated or node.get("aggregate_handling") != "STANDARD_HANDLING"
        aggregated = aggregated or self._has_aggregate(node.get("select_list"))
        if not aggregated:
            return self._rows()
        try:
            return self._aggregate(inner=False)
        except _Inner:
            return self._aggregate(inner=True)

    def _has_aggregate(self, node: Any) -> bool:
        if isinstance(node, dict):
            if node.get("class") == "SUBQUERY":
                return False
            if node.get("class") == "FUNCTION" and self._is_aggregate(node["function_name"]):
                return True
            return any(self._has_aggregate(v) for v in node.values())
        if isinstance(node, list):
            return any(self._has_aggregate(v) for v in node)
        return False

    _aggregates: frozenset[str] | None = None

    def _is_aggregate(self, name: str) -> bool:
        if _Planner._aggregates is None:
            rows = self.con.execute(
                "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type = 'aggregate'"
            ).fetchall()
            _Planner._aggregates = frozenset(r[0] for r in rows) | {"count_star"}
        return name in _Planner._aggregates

    # ---- no FROM: scalar subqueries ---------------------------------------------------------------

    def _scalars(self) -> ShardPlan:
        """``SELECT (SELECT count(*) FROM runs WHERE ...) AS known, (SELECT ...) AS rows``: each scalar
        subquery is planned as a query of its own; each shard returns its partial row as a struct
        (one column per subquery), and the merge runs each subquery's merge over its column unnested.
        Expressions without a subquery are the same on every shard (one of them is kept)."""
        shard_items, merged = [], []
        for i, item in enumerate(self.node["select_list"]):
            column, name = f"__vigil_s{i}", _quote(self.name_of(item))
            if item.get("class") == "SUBQUERY" and item.get("subquery_type") == "SCALAR":
                inner = self.with_node(self._with_ctes(item["subquery"]["node"]))
                sub = _Planner(inner, source=f"(SELECT unnest({_quote(column)}) FROM {PARTIALS})").plan()
                if sub.mode != "partial":
                    raise QueryRefusedError(
                        "across shards, a scalar subquery in a SELECT without FROM must be an aggregate "
                        f"(count, sum, min, max, avg...), not {inner!r}"
                    )
                shard_items.append(f"(SELECT __vigil_t FROM ({sub.shard_sql}) AS __vigil_t) AS {_quote(column)}")
                merged.append(f"({sub.merge_sql}) AS {name}")
            elif has_class(item, frozenset({"SUBQUERY"})):
                raise QueryRefusedError("across shards, put a scalar subquery alone in its select item")
            else:
                node = parse(self.con, "SELECT 1")["statements"][0]["node"]
                node["select_list"] = [{**item, "alias": column}]
                shard_items.append(self.with_node(node).removeprefix("SELECT "))
                merged.append(f"(SELECT any_value({_quote(column)}) FROM {PARTIALS}) AS {name}")
        return ShardPlan("SELECT " + ", ".join(shard_items), "SELECT " + ", ".join(merged), "partial", False)

    def _with_ctes(self, node: dict[str, Any]) -> dict[str, Any]:
        """A subquery's node with the CTEs of the query around it, so it can be planned on its own."""
        out = copy.deepcopy(node)
        own = out.setdefault("cte_map", {"map": []}).setdefault("map", [])
        names = {cte["key"] for cte in own}  # the subquery's own CTE of a name hides the outer one
        outer = [cte for cte in (self.node.get("cte_map") or {}).get("map") or [] if cte["key"] not in names]
        out["cte_map"]["map"] = [*copy.deepcopy(outer), *own]
        return out

    # ---- rows ------------------------------------------------------------------------------------

    def _rows(self) -> ShardPlan:
        node = copy.deepcopy(self.node)
        mods = node["modifiers"]
        distinct = any(m["type"] == "DISTINCT_MODIFIER" for m in mods)
        if any(m["type"] == "DISTINCT_MODIFIER" and m.get("distinct_on_targets") for m in mods):
            raise QueryRefusedError("DISTINCT ON cannot be merged across shards; group by the key instead")
        hidden: list[str] = []
        order_sql: list[str] = []
        limit_sql = ""
        for mod in mods:
            if mod["type"] == "ORDER_MODIFIER":
                for i, order in enumerate(mod["orders"]):
                    position = is_int(order["expression"])
                    if position is not None:
                        target = str(position)
                    else:
                        if distinct:
                            raise QueryRefusedError(
                                "across shards, SELECT DISTINCT orders by output positions only (ORDER BY 1, 2)"
                            )
                        name = f"__vigil_o{i}"
                        key = self._aliased(order["expression"], node["select_list"])
                        node["select_list"].append({**copy.deepcopy(key), "alias": name})
                        hidden.append(name)
                        target = _quote(name)
                    order_sql.append(target + self._direction(order))
            elif mod["type"] == "LIMIT_MODIFIER":
                limit_sql = self._limit(mod)
        columns = f"* EXCLUDE ({', '.join(_quote(h) for h in hidden)})" if hidden else "*"
        merge = f"SELECT {'DISTINCT ' if distinct else ''}{columns} FROM {self.source}"
        if order_sql:
            merge += " ORDER BY " + ", ".join(order_sql)
        merge += limit_sql
        return ShardPlan(self.with_node(node), merge, "rows", shard_limit_follows_user=True)

    @staticmethod
    def _aliased(expr: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
        """What an ORDER BY expression orders by: a bare name is an item's alias before it is a column (the
        hidden column must not read the column that alias shadows)."""
        if expr.get("class") == "COLUMN_REF" and len(expr["column_names"]) == 1:
            for item in items:
                if item.get("alias") == expr["column_names"][0]:
                    return {**item, "alias": ""}
        return expr

    @staticmethod
    def _direction(order: dict[str, Any]) -> str:
        text = {"DESCENDING": " DESC", "ASCENDING": " ASC"}.get(order["type"], "")
        # DuckDB's tree writes the null order as its SQL ("NULLS FIRST"), or ORDER_DEFAULT.
        null_order = str(order["null_order"]).replace("_", " ")
        return text + (f" {null_order}" if null_order in ("NULLS FIRST", "NULLS LAST") else "")

    def _limit(self, mod: dict[str, Any]) -> str:
        """The merge's LIMIT/OFFSET text; the shard's modifier becomes ``LIMIT limit+offset``."""
        if mod.get("limit_type", "ROW_COUNT") != "ROW_COUNT":
            raise QueryRefusedError("LIMIT by percentage cannot be merged across shards; use a row count")
        limit, offset = mod.get("limit"), mod.get("offset")
        sql = ""
        shell = parse(self.con, "SELECT 1")["statements"][0]["node"]
        if limit is not None:
            shell["select_list"] = [{**limit, "alias": ""}]
            sql += " LIMIT " + self.with_node(shell).removeprefix("SELECT ")
        if offset is not None:
            shell["select_list"] = [{**offset, "alias": ""}]
            offset_text = self.with_node(shell).removeprefix("SELECT ")
            sql += " OFFSET " + offset_text
            if limit is not None:
                limit_text = sql.split(" OFFSET ")[0].removeprefix(" LIMIT ")
                mod["limit"] = self.expr(f"({limit_text}) + ({offset_text})")
            mod["offset"] = None
        return sql

    # ---- aggregates ------------------------------------------------------------------------------

    def _aggregate(self, *, inner: bool) -> ShardPlan:
        node = self.node
        if len(node.get("group_sets") or [[]]) > 1:
            raise QueryRefusedError("GROUPING SETS, ROLLUP and CUBE cannot be merged across shards")
        items = node["select_list"]
        if node.get("aggregate_handling") == "FORCE_AGGREGATES":  # GROUP BY ALL: every item without an aggregate
            groups = [{**copy.deepcopy(i), "alias": ""} for i in items if not self._has_aggregate(i)]
            group_sets = [list(range(len(groups)))] if groups else []
        elif node.get("aggregate_handling") != "STANDARD_HANDLING":
            raise QueryRefusedError(f"{node.get('aggregate_handling')} cannot be merged across shards")
        else:
            groups = [self._group_expr(g, items) for g in node.get("group_expressions") or []]
            group_sets = node.get("group_sets") or []
        self.groups = {node_key(g): i for i, g in enumerate(groups)}
        self.group_names: dict[str, list[int]] = {}
        for i, g in enumerate(groups):
            if g.get("class") == "COLUMN_REF":
                self.group_names.setdefault(g["column_names"][-1], []).append(i)
        # A GROUP BY name that is also an item's alias is bound by each shard's DuckDB as the oracle binds it
        # (a column of that name first, else the item): the item goes first under its alias, so the name
        # can reach it, and its value is shipped, since the merge cannot tell which of the two it was.
        lateral = self._aliased_items(groups, items)
        self.shipped = {node_key(item): _quote(item["alias"]) for item in lateral}
        self.inner = inner
        self.shard_items: list[dict[str, Any]] = [
            *(copy.deepcopy(item) for item in lateral),
            *({**copy.deepcopy(g), "alias": f"__vigil_g{i}"} for i, g in enumerate(groups)),
        ]
        # An integer constant in GROUP BY would read as a position: the shard groups by its column's position.
        shard_groups = [
            self.expr(str(len(lateral) + i + 1)) if g.get("class") == "CONSTANT" else g for i, g in enumerate(groups)
        ]
        self.inner_keys: dict[str, str] = {}
        self.duplicate_blind = True
        merged_items = [{**self._rw(item), "alias": self.name_of(item)} for item in items]
        having = self._rw(node["having"]) if node.get("having") is not None else None
        outputs = {str(item["alias"]) for item in merged_items}
        mods = []
        for mod in node["modifiers"]:
            mod = copy.deepcopy(mod)
            if mod["type"] == "ORDER_MODIFIER":
                for order in mod["orders"]:
                    # ORDER BY binds a bare name to an output column first, as the merge does: left as written.
                    if not self._output_name(order["expression"], outputs):
                        order["expression"] = self._rw(order["expression"])
            mods.append(mod)

        if has_class([merged_items, having, mods], frozenset({"SUBQUERY"})):
            raise QueryRefusedError(
                "a subquery outside the GROUP BY keys and aggregate arguments would run over the merged answer; "
                "move it into a GROUP BY key or a subquery in FROM"
            )
        shard = copy.deepcopy(node)
        shard["select_list"] = self.shard_items or [self.expr("1 AS __vigil_one")]
        shard["modifiers"] = []
        shard["having"] = None
        shard["aggregate_handling"] = "STANDARD_HANDLING"
        shard["group_expressions"] = shard_groups
        shard["group_sets"] = group_sets
        if inner:
            shard["group_expressions"], shard["group_sets"] = [], []
            if self.duplicate_blind:
                shard["modifiers"] = [{"type": "DISTINCT_MODIFIER", "distinct_on_targets": []}]
        merge = copy.deepcopy(parse(self.con, f"SELECT 1 FROM {self.source}")["statements"][0]["node"])
        merge["select_list"] = merged_items
        merge["group_expressions"] = [self.expr(_quote(f"__vigil_g{i}")) for i in range(len(groups))]
        merge["group_sets"] = group_sets
        merge["having"] = having
        merge["modifiers"] = mods
        tree = copy.deepcopy(self.tree)
        tree["statements"][0]["node"] = merge
        merge_sql = to_sql(self.con, tree)
        return ShardPlan(self.with_node(shard), merge_sql, "inner" if inner else "partial", False)

    def _group_expr(self, g: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
        """A GROUP BY entry as an expression: ``GROUP BY 1`` names a select item; a name stays a name (it may
        be a column or an item's alias: see :meth:`_aliased_items`)."""
        position = is_int(g)
        if position is not None and 1 <= position <= len(items):
            return {**copy.deepcopy(items[position - 1]), "alias": ""}
        return g

    @staticmethod
    def _aliased_items(groups: list[dict[str, Any]], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The select items whose alias a GROUP BY entry names, when the item is not that very column."""
        names = {g["column_names"][0] for g in groups if g.get("class") == "COLUMN_REF" and len(g["column_names"]) == 1}
        out = []
        for item in items:
            same = item.get("class") == "COLUMN_REF" and item["column_names"][-1] == item.get("alias")
            if item.get("alias") in names and not same:
                out.append(item)
        return out

    @staticmethod
    def _output_name(expr: dict[str, Any], outputs: set[str]) -> bool:
        return (
            expr.get("class") == "COLUMN_REF" and len(expr["column_names"]) == 1 and expr["column_names"][0] in outputs
        )

    def _group_index(self, node: dict[str, Any]) -> int | None:
        """Which group key ``node`` is: the same expression, or the same column named with or without its table
        (a valid query names one column so when only one group key has that name)."""
        index = self.groups.get(node_key(node))
        if index is None and node.get("class") == "COLUMN_REF":
            same_name = self.group_names.get(node["column_names"][-1], [])
            index = same_name[0] if len(same_name) == 1 else None
        return index

    def _rw(self, node: Any) -> Any:
        """``node`` as the merge query sees it: group keys and aggregates replaced by partials' columns."""
        if isinstance(node, list):
            return [self._rw(v) for v in node]
        if not isinstance(node, dict):
            return node
        if node.get("class") is not None:
            shipped = self.shipped.get(node_key(node))
            if shipped is not None:  # one value per group: any shard's
                return {**self.expr(f"any_value({shipped})"), "alias": node.get("alias", "")}
            index = self._group_index(node)
            if index is not None:
                return {**self.expr(_quote(f"__vigil_g{index}")), "alias": node.get("alias", "")}
            if node.get("class") == "FUNCTION" and self._is_aggregate(node["function_name"]):
                return {**self._aggregate_call(node), "alias": node.get("alias", "")}
        return {k: self._rw(v) for k, v in node.items()}

    def _shard_column(self, expr: dict[str, Any], prefix: str) -> str:
        name = f"__vigil_{prefix}{len(self.shard_items)}"
        self.shard_items.append({**copy.deepcopy(expr), "alias": name})
        return _quote(name)

    def _aggregate_call(self, call: dict[str, Any]) -> dict[str, Any]:
        name = call["function_name"]
        if self.inner:
            return self._inner_call(call)
        plain = not call.get("distinct") and not (call.get("order_bys") or {}).get("orders")
        if name in _PARTIAL_FUNCS and (plain or name in _DUPLICATE_BLIND):
            column = self._shard_column({**call, "distinct": False}, "a")
            return self.expr(_PARTIAL_FUNCS[name].format(column))
        if name in _AVERAGES and plain:
            total = self._shard_column({**self._renamed(call, "sum")}, "a")
            count = self._shard_column({**self._renamed(call, "count")}, "a")
            return self.expr(f"CAST(sum({total}) AS DOUBLE) / nullif(sum({count}), 0)")
        raise _Inner(name)

    def _renamed(self, call: dict[str, Any], name: str) -> dict[str, Any]:
        out = copy.deepcopy(call)
        out["function_name"] = name
        if "qualified_name" in out:
            out["qualified_name"] = {"path": [name]}
        return out

    def _inner_call(self, call: dict[str, Any]) -> dict[str, Any]:
        """The aggregate over the shards' inner rows: its arguments, FILTER and ORDER BY read shard columns."""
        if call["function_name"] not in _DUPLICATE_BLIND and not call.get("distinct"):
            self.duplicate_blind = False
        out = copy.deepcopy(call)

        def column(expr: dict[str, Any]) -> dict[str, Any]:
            if expr.get("class") == "CONSTANT":  # a separator, a quantile: stays a constant
                return expr
            key = node_key(expr)
            if key not in self.inner_keys:
                self.inner_keys[key] = self._shard_column(expr, "x")
            return self.expr(self.inner_keys[key])

        for arg in out.get("arguments") or []:
            arg["expression"] = column(arg["expression"])
        if out.get("children") is not None:
            out["children"] = [column(c) for c in out["children"]]
        if out.get("filter") is not None:
            out["filter"] = column(out["filter"])
        for order in (out.get("order_bys") or {}).get("orders") or []:
            order["expression"] = column(order["expression"])
        return out


def plan(sql: str) -> ShardPlan:
    """How ``sql`` is answered across shards (see the module's docstring).

    Raises:
        QueryRefusedError: the query cannot be merged across shards; the message says what to write instead.
    """
    return _Planner(sql).plan()
