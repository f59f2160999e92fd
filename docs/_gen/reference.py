"""The reference pages, generated from the code: settings, CLI, SQL tables, detectors, the wire's JSON Schema.

Nothing here holds a description of its own: every word of a row comes from the code it documents (a
struct's ``Attributes:`` docstring section, an attribute docstring or the comment above a field, an
argparse ``help``, a ``COMMENT ON`` of ``schema.sql``, a detector module's docstring, a JSON Schema
``description``). ``hooks.py`` turns :func:`pages` into site pages at build time, and
``tests/integration/test_docs.py`` fails when a row has no description.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import textwrap
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Setting:
    """One configuration key: where it lives, what it takes, what it does."""

    key: str
    type: str
    default: str
    range: str
    env: str
    description: str


@dataclass(frozen=True)
class Flag:
    """One argument of one ``vigil`` command."""

    command: str
    flags: str
    default: str
    description: str


@dataclass(frozen=True)
class Column:
    """One column of a table or view of the history file."""

    table: str
    name: str
    type: str
    description: str


# ---- text ------------------------------------------------------------------------------------------


def markdown(text: str) -> str:
    """A docstring's reStructuredText roles and double backticks as Markdown code, on one line."""
    text = re.sub(r":(?:class|func|meth|data|mod|attr|exc):`~?\.?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return " ".join(text.split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---- where struct fields are described -----------------------------------------------------------------


def _attributes_section(doc: str | None) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Attributes:`` section (``a, b: text`` names several)."""
    found: dict[str, str] = {}
    if not doc:
        return found
    lines = inspect.cleandoc(doc).splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return found
    names: list[str] = []
    for line in lines[start + 1 :]:
        if line.strip() and not line.startswith(" "):
            break  # the section ended
        entry = re.match(r"^ {4}([A-Za-z_][\w, ]*):\s*(.*)$", line)
        if entry:
            names = [n.strip() for n in entry.group(1).split(",")]
            for name in names:
                found[name] = entry.group(2)
        elif line.strip() and names:
            for name in names:
                found[name] += " " + line.strip()
    return found


def _source_notes(cls: type) -> dict[str, str]:
    """Attribute docstrings (a string right after a field) and ``#`` comments right above a field."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    notes: dict[str, str] = {}
    body = ast.parse(source).body[0]
    if not isinstance(body, ast.ClassDef):
        return notes
    for i, node in enumerate(body.body):
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        name = node.target.id
        after = body.body[i + 1] if i + 1 < len(body.body) else None
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            notes[name] = after.value.value
            continue
        comment = _comment_above(lines, node.lineno - 1)
        if comment:
            notes[name] = comment
    return notes


def _comment_above(lines: list[str], index: int) -> str:
    """The ``#`` lines directly above ``lines[index]``, joined."""
    found: list[str] = []
    i = index - 1
    while i >= 0 and lines[i].strip().startswith("#"):
        found.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(found)


def _defstruct_notes(module: types.ModuleType, struct_name: str) -> dict[str, str]:
    """For a ``msgspec.defstruct("Name", [("field", ...), ...])``: the ``#`` comment above each field's tuple.

    One comment above several tuples describes the first; the others need their own."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    notes: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or getattr(node.func, "attr", getattr(node.func, "id", "")) != "defstruct":
            continue
        if not node.args or getattr(node.args[0], "value", None) != struct_name:
            continue
        fields = node.args[1]
        for element in getattr(fields, "elts", []):
            if isinstance(element, ast.Tuple) and isinstance(element.elts[0], ast.Constant):
                comment = _comment_above(lines, element.lineno - 1)
                if comment:
                    notes[str(element.elts[0].value)] = comment
    return notes


def field_notes(struct: type[msgspec.Struct]) -> dict[str, str]:
    """Every field's description, from the struct and its bases (the nearest class wins)."""
    notes: dict[str, str] = {}
    for cls in reversed(struct.__mro__):
        if cls in (object, msgspec.Struct):
            continue
        notes.update(_source_notes(cls))
        notes.update(_attributes_section(cls.__doc__))
    if struct.__name__ == "DetectorsConfig":
        import trainvigil.daemon.detectors as detectors

        notes.update(_defstruct_notes(detectors, "DetectorsConfig"))
    return {name: markdown(text) for name, text in notes.items()}


# ---- where struct fields are limited -------------------------------------------------------------------


def _post_init_rules(struct: type) -> dict[str, str]:
    """The range each key of ``struct`` is checked against in ``__post_init__`` (``daemon/config.py``'s checks)."""
    post_init = struct.__dict__.get("__post_init__")
    if post_init is None:
        return {}
    tree = ast.parse(textwrap.dedent(inspect.getsource(post_init)))
    rules: dict[str, str] = {}

    def literal(node: ast.AST) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    def visit(node: ast.AST, keys: dict[str, list[str]]) -> None:
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple):
            names = [n for n in (literal(e) for e in node.iter.elts) if n]
            for statement in node.body:
                visit(statement, {**keys, node.target.id: names})
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            first = node.args[0]
            targets = [literal(first)] if literal(first) else keys.get(getattr(first, "id", ""), [])
            rule = _rule_of(node)
            for key in targets:
                if key and rule:
                    rules.setdefault(key.rsplit(".", 1)[-1], rule)
        for child in ast.iter_child_nodes(node):
            visit(child, keys)

    visit(tree, {})
    return rules


def _rule_of(call: ast.Call) -> str | None:
    name = getattr(call.func, "id", "")
    if name == "_require" and len(call.args) >= 3:
        rule = call.args[2]
        if isinstance(rule, ast.Constant) and isinstance(rule.value, str):
            return rule.value
        return None  # a rule built at run time: the description says it
    if name == "_positive":
        return "a number > 0"
    if name == "_port":
        lowest = next((k.value for k in call.keywords if k.arg == "lowest"), ast.Constant(0))
        return f"a port number {getattr(lowest, 'value', 0)}-65535"
    if name == "_name":
        return "a name without spaces, '.', '*', '>', '/'"
    if name == "_kinds":
        return "fault kinds (`vigil canary run --help` lists them), or all"
    if name == "_every":
        return "an interval (30m, 90s, 2h) or a cron expression"
    if name == "_nats_url":
        return "NATS URLs (nats, tls, ws, wss), comma-separated"
    return None


def _meta_rule(meta: msgspec.Meta) -> str:
    parts = []
    for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        value = getattr(meta, attr)
        if value is not None:
            parts.append(f"{sign} {value}")
    if meta.min_length is not None:
        parts.append(f"at least {meta.min_length} characters")
    if meta.pattern is not None and meta.description:  # a pattern said in words, as the error says it
        parts.append(meta.description)
    return ", ".join(parts)


def type_name(tp: Any) -> tuple[str, str]:
    """The type as a reader would say it, and the range its ``Meta`` gives (or "")."""
    if get_origin(tp) is Annotated:
        base, *metas = get_args(tp)
        name, _ = type_name(base)
        rules = [_meta_rule(m) for m in metas if isinstance(m, msgspec.Meta)]
        return name, ", ".join(r for r in rules if r)
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in get_args(tp)), ""
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(type_name(a)[0] for a in get_args(tp)), ""
    if get_origin(tp) is list:
        (item,) = get_args(tp)
        return f"list of {type_name(item)[0]}", ""
    if get_origin(tp) is dict:
        key, value = get_args(tp)
        return f"table of {type_name(key)[0]} → {type_name(value)[0]}", ""
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}
    return names.get(tp, getattr(tp, "__name__", str(tp))), ""


def _human_bytes(value: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size and value % size == 0:
            return f"{value} ({value // size} {unit})"
    return str(value)


def default_text(field: msgspec.structs.FieldInfo) -> str:
    """The default as TOML would write it; a computed default by its function's own description."""
    if field.required:
        return "required"
    if field.default is not msgspec.NODEFAULT:
        value = field.default
    else:
        factory = field.default_factory
        if getattr(factory, "__name__", "<lambda>") != "<lambda>" and not isinstance(factory, type):
            doc = inspect.getdoc(factory) or f"{factory.__name__}()"
            return markdown(re.split(r"(?<=[.:])\s", doc, maxsplit=1)[0].rstrip(":."))
        value = factory()
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and field.name.endswith("bytes"):
        return _human_bytes(value)
    if isinstance(value, str | int | float):
        return f"`{json.dumps(value)}`" if isinstance(value, str) else f"`{value}`"
    if isinstance(value, list | tuple):
        return "`" + json.dumps(list(value)) + "`"
    if isinstance(value, dict):
        return "`{}`" if not value else "`" + json.dumps(value) + "`"
    return f"`{value}`"


def _unit(name: str) -> str:
    return " (seconds)" if name.endswith("_s") else " (bytes)" if name.endswith("_bytes") else ""


def struct_settings(
    struct: type[msgspec.Struct],
    path: tuple[str, ...] = (),
    env: Callable[[tuple[str, ...]], str] | None = None,
    stop: Callable[[tuple[str, ...]], bool] = lambda path: False,
) -> Iterator[Setting]:
    """One :class:`Setting` per leaf key of ``struct`` (nested Structs become their keys), in field order."""
    from trainvigil.schemas.settings import env_name

    env = env or (lambda key: f"`{env_name(key)}`")
    notes = field_notes(struct)
    rules = _post_init_rules(struct)
    for field in msgspec.structs.fields(struct):
        key = (*path, field.name)
        tp = field.type
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            if not stop(key):
                yield from struct_settings(tp, key, env, stop)
            continue
        name, meta_range = type_name(tp)
        item = get_args(tp)[0] if get_origin(tp) is list and get_args(tp) else None
        if isinstance(item, type) and issubclass(item, msgspec.Struct):
            # A list of tables ([[canary.jobs]]): its keys, without variables.
            yield Setting(
                ".".join(key), f"list of `[[{'.'.join(key)}]]` tables", "`[]`", "", "", notes.get(field.name, "")
            )
            yield from struct_settings(item, key, lambda k: "", stop)
            continue
        yield Setting(
            key=".".join(key),
            type=name + _unit(field.name),
            default=default_text(field),
            range=meta_range or rules.get(field.name, ""),
            env=env(key),
            description=notes.get(field.name, ""),
        )


def agent_settings() -> list[Setting]:
    """``trainvigil.init()``'s options (``agents/options.py``)."""
    from trainvigil.agents import options

    from_torchrun: dict[str, str] = options._FROM_TORCHRUN
    not_vigil: frozenset[str] = options._NOT_VIGIL_ENV

    def env(key: tuple[str, ...]) -> str:
        if key[0] in from_torchrun:
            return f"`{from_torchrun[key[0]]}`"
        if key[0] in not_vigil:
            return "(see its description)"
        return f"`{options.env_name(key)}`"

    return [s for s in struct_settings(options.AgentOptions, env=env) if s.key != "host"]


def daemon_settings() -> list[Setting]:
    """``vigil up``'s configuration (``daemon/config.py``), less the detectors' own tables."""
    from trainvigil.daemon import detectors
    from trainvigil.daemon.config import DaemonConfig

    names = {d.name for d in detectors.REGISTRY}
    return list(struct_settings(DaemonConfig, stop=lambda key: key[:1] == ("detectors",) and key[-1] in names))


def detector_settings(detector: Any) -> list[Setting]:
    """The ``[detectors.<name>]`` table of one detector."""
    return list(struct_settings(detector.Settings, ("detectors", detector.name)))


def all_settings() -> list[Setting]:
    from trainvigil.daemon import detectors

    found = agent_settings() + daemon_settings()
    for detector in detectors.REGISTRY:
        found += detector_settings(detector)
    return found


_SETTING_HEADER = ("key", "type", "default", "range", "environment", "description")


def _setting_rows(settings: list[Setting], strip: str = "") -> list[tuple[str, ...]]:
    return [
        (f"`{s.key.removeprefix(strip)}`", s.type, s.default, s.range, s.env, s.description or "**undocumented**")
        for s in settings
    ]


def settings_page() -> str:
    from trainvigil.daemon.config import DaemonConfig

    daemon = daemon_settings()
    out = [
        "# Settings\n",
        "Generated from the settings structs at build time (`agents/options.py`, `daemon/config.py`, the detectors' "
        "settings); the mechanism they share is `trainvigil.schemas.settings`. A value of the wrong type or out of "
        "range is a `ConfigError` naming the key and its variable.\n",
        "## Agent: `trainvigil.init()` options\n",
        markdown((inspect.getdoc(_agent_options()) or "").split("\n\n")[1]) + "\n",
        table(_SETTING_HEADER, _setting_rows(agent_settings())),
        "## Daemon: `vigil up`\n",
        markdown((inspect.getmodule(DaemonConfig).__doc__ or "").strip()) + "\n",
    ]
    groups: dict[str, list[Setting]] = {}
    for s in daemon:
        parts = s.key.split(".")
        group = "" if len(parts) == 1 else ".".join(parts[:-1])
        groups.setdefault(group, []).append(s)
    for group, rows in groups.items():
        title = "Top level" if not group else f"`[{group}]`"
        out += [f"### {title}\n", table(_SETTING_HEADER, _setting_rows(rows, f"{group}." if group else ""))]
    out.append("Each detector's own table, `[detectors.<name>]`, is on the [detectors](detectors.md) page.\n")
    return "\n".join(out)


def _agent_options() -> type:
    from trainvigil.agents.options import AgentOptions

    return AgentOptions


# ---- the CLI ---------------------------------------------------------------------------------------------


def commands(
    parser: argparse.ArgumentParser | None = None, prefix: str = "vigil"
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """Every command, nested ones included (``vigil canary run``), with its help and its parser."""
    from trainvigil.daemon.cli import _parser

    if parser is None:
        from trainvigil.daemon.cli.main import build_parser

        parser = build_parser()
    return _parser.commands(parser, prefix)


def flags(name: str, parser: argparse.ArgumentParser) -> list[Flag]:
    """The arguments of one command (not ``-h``, not a nested command's)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            spelled = ", ".join(f"`{o}`" for o in action.option_strings)
            if action.nargs != 0:
                spelled += f" `{action.metavar or action.dest.upper()}`"
        else:
            spelled = f"`{action.metavar or action.dest.upper()}`"
        if action.choices is not None and not isinstance(action.choices, dict):
            spelled += " (" + " \\| ".join(f"`{c}`" for c in action.choices) + ")"
        default = "" if action.default in (None, False, argparse.SUPPRESS) else f"`{action.default}`"
        found.append(Flag(name, spelled, default, markdown(action.help or "")))
    return found


def all_flags() -> list[Flag]:
    return [f for name, _, parser in commands() for f in flags(name, parser)]


def cli_page() -> str:
    import importlib

    from trainvigil.daemon.cli import _exits

    # The module, not the function `trainvigil.daemon.cli.main` that the package re-exports under its name.
    doc = inspect.getdoc(importlib.import_module("trainvigil.daemon.cli.main")) or ""
    rest = "\n\n".join(p for p in doc.split("\n\n")[1:] if not p.startswith("Exit codes"))
    out = [
        "# CLI\n",
        "Generated from `vigil`'s argparse parser (`daemon/cli/main.py`) at build time. `vigil COMMAND --help` "
        "prints the same.\n",
        "## Exit codes\n",
        markdown((inspect.getdoc(_exits) or "").split("\n\n")[0]) + "\n",
        markdown(rest) + "\n",
        table(("code", "constant", "meaning"), [(str(c), f"`{n}`", m) for c, (n, m) in _exits.MEANINGS.items()]),
    ]
    for name, help_text, parser in commands():
        out.append(f"## `{name}`\n")
        description = markdown(parser.description or help_text)
        if description:
            out.append(description + "\n")
        rows = [(f.flags, f.default, f.description or "**undocumented**") for f in flags(name, parser)]
        if rows:
            out.append(table(("argument", "default", "what"), rows))
        out.append(table(("exit code", "when"), [(str(c), markdown(w)) for c, w in _exits.codes(name).items()]))
    return "\n".join(out)


# ---- the SQL tables --------------------------------------------------------------------------------------


def _history() -> Any:
    import duckdb

    from trainvigil.daemon.store.schema import SCHEMA_SQL

    con = duckdb.connect()
    con.execute(SCHEMA_SQL)
    return con


def sql_columns() -> list[Column]:
    """Every column of every table (not views) ``schema.sql`` creates, with its ``COMMENT ON``."""
    con = _history()
    rows = con.execute(
        "SELECT c.table_name, c.column_name, c.data_type, coalesce(c.comment, '') FROM duckdb_columns() c "
        "JOIN duckdb_tables() t USING (table_name) WHERE c.database_name = 'memory' ORDER BY t.table_oid, "
        "c.column_index"
    ).fetchall()
    return [Column(*row) for row in rows]


def sql_page() -> str:
    from trainvigil.daemon.store.schema import SCHEMA_VERSION

    con = _history()
    out = [
        "# SQL tables\n",
        "Generated at build time from `daemon/store/schema.sql` (its `COMMENT ON` statements, which the history file "
        "also carries: `select table_name, column_name, comment from duckdb_columns()`). Schema version "
        f"{SCHEMA_VERSION}.\n",
    ]
    tables = con.execute(
        "SELECT table_name, coalesce(comment, '') FROM duckdb_tables() WHERE database_name = 'memory' "
        "ORDER BY table_oid"
    ).fetchall()
    columns = sql_columns()
    for name, comment in tables:
        out += [f"## `{name}`\n", markdown(comment) + "\n"]
        rows = [(f"`{c.name}`", f"`{c.type}`", c.description or "**undocumented**") for c in columns if c.table == name]
        out.append(table(("column", "type", "what (units)"), rows))
    views = con.execute(
        "SELECT view_name, coalesce(comment, '') FROM duckdb_views() WHERE NOT internal ORDER BY view_name"
    ).fetchall()
    out.append("## Views\n")
    for name, comment in views:
        cols = con.execute(
            "SELECT column_name, data_type, coalesce(comment, '') FROM duckdb_columns() WHERE table_name = ? "
            "ORDER BY column_index",
            [name],
        ).fetchall()
        out += [f"### `{name}`\n", markdown(comment) + "\n"]
        out.append(
            table(("column", "type", "what"), [(f"`{c}`", f"`{t}`", d or "as in the table") for c, t, d in cols])
        )
    return "\n".join(out)


# ---- detectors ------------------------------------------------------------------------------------------


def detectors_page() -> str:
    from trainvigil.daemon import detectors

    out = [
        "# Detectors\n",
        "Generated from the registry (`trainvigil.daemon.detectors.REGISTRY`) at build time, in the order the daemon "
        "runs them. Each detector's settings are the TOML table `[detectors.<name>]` and the variables "
        "`VIGIL_DETECTORS_<NAME>_<KEY>`; `enabled = false` leaves it out. How well they work is on the "
        "[performance](../performance.md) page.\n",
        markdown(inspect.getdoc(detectors) or "") + "\n",
    ]
    for detector in detectors.REGISTRY:
        module = inspect.getmodule(detector)
        out.append(f"## `{detector.name}`\n")
        doc = inspect.getdoc(module) or ""
        paragraphs = doc.split("\n\n")
        out.append("\n\n".join(markdown(p) for p in paragraphs) + "\n")
        if getattr(detector, "coalesce", False):
            out.append(
                "*Per-step detector*: on batches of many streams it may judge a stream's steps a little later, "
                "several messages at once (`coalesce_*` in `[detectors]`).\n"
            )
        rows = _setting_rows(detector_settings(detector), f"detectors.{detector.name}.")
        out.append(table(_SETTING_HEADER, rows))
    return "\n".join(out)


# ---- the wire --------------------------------------------------------------------------------------------


def _json_type(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in spec:
        return " or ".join(_json_type(s) for s in spec["anyOf"])
    kind = spec.get("type", "any")
    if kind == "array":
        return f"array of {_json_type(spec.get('items', {}))}"
    if "enum" in spec:
        return "one of " + ", ".join(f"`{v}`" for v in spec["enum"])
    if "const" in spec:
        return f"`{json.dumps(spec['const'])}`"
    return str(kind)


def _json_limits(spec: dict[str, Any]) -> str:
    names = {
        "minimum": ">=",
        "maximum": "<=",
        "exclusiveMinimum": ">",
        "minLength": "length >=",
        "maxLength": "length <=",
    }
    return ", ".join(f"{sign} {spec[k]}" for k, sign in names.items() if k in spec)


def wire_page() -> str:
    from trainvigil.schemas import records, subjects

    default = subjects.DEFAULT_SUBJECTS

    envelope = json.loads((ROOT / "schemas/json/envelope.schema.json").read_text())
    files = sorted(p.name for p in (ROOT / "schemas/json").glob("*.json"))
    out = [
        "# The wire\n",
        "Generated at build time from the JSON Schema files in `schemas/json/` (written from the msgspec structs of "
        "`trainvigil.schemas`, `tests/unit/test_schemas.py` keeps them equal) for producers in other languages: "
        + ", ".join(f"`{f}`" for f in files)
        + ".\n",
        markdown(inspect.getdoc(records) or "") + "\n",
        "## Subjects\n",
        markdown(inspect.getdoc(subjects) or "") + "\n",
        table(
            ("what", "subject"),
            [(f"`{k}` records", f"`{default.prefix}.<run>.{k}`") for k in subjects.KINDS]
            + [
                ("alerts", f"`{default.prefix}.alerts.<run>`"),
                ("SQL queries", f"`{default.query}`"),
                ("canary triggers", f"`{default.canary}`"),
                (
                    "namespace `N`",
                    f"`N.{default.prefix}.…` (every subject above), stream `{subjects.Subjects('N').stream_name}`",
                ),
            ],
        ),
    ]
    for name, spec in sorted(envelope["$defs"].items()):
        out += [f"## {name}\n", markdown(spec.get("description", "")) + "\n"]
        props = spec.get("properties", {})
        required = set(spec.get("required", []))
        rows = [
            (
                f"`{p}`",
                _json_type(s),
                "required" if p in required else f"`{json.dumps(s['default'])}`" if "default" in s else "",
                _json_limits(s),
                markdown(s.get("description", "")),
            )
            for p, s in props.items()
        ]
        out.append(table(("field", "type", "default", "limits", "what"), rows))
    return "\n".join(out)


def pages() -> dict[str, str]:
    """Site path → Markdown of every generated page."""
    return {
        "reference/settings.md": settings_page(),
        "reference/cli.md": cli_page(),
        "reference/sql.md": sql_page(),
        "reference/detectors.md": detectors_page(),
        "reference/wire.md": wire_page(),
    }


def contracts_table() -> str:
    """The import-linter contracts of ``pyproject.toml``, as a table (the architecture page's layers)."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    rows = []
    for c in contracts:
        if c["type"] == "layers":
            rule = "from top to bottom, each may import only those below it: " + " → ".join(
                f"`{layer}`" for layer in c["layers"]
            )
            rule += " (within " + ", ".join(f"`{x}`" for x in c["containers"]) + ")"
        else:
            sources = ", ".join(f"`{s}`" for s in c["source_modules"])
            rule = f"{sources} never import " + ", ".join(f"`{m}`" for m in c["forbidden_modules"])
        rows.append((c["name"], rule))
    return table(("contract", "rule"), rows)
