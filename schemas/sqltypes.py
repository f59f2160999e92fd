"""Column types on the query wire: a closed grammar of DuckDB's type names, parsed into values (pure).

An answer names its columns' types as DuckDB writes them (``BIGINT``, ``DECIMAL(18,3)``,
``MAP(VARCHAR, DOUBLE)``). The CLI writes SQL with them: shards' answers are cast back to these
types before they are merged, and a Parquet export asks DuckDB for their Arrow types. Whatever
answers on the bus chose that text, so it never reaches SQL as text: :func:`parse_type` accepts
exactly the types a daemon sends (the names in :class:`Scalar`, and ``DECIMAL``, lists ``T[]``,
arrays ``T[N]``, ``STRUCT`` and ``MAP`` built from them, within bounds) and returns a
value; SQL is written from that value by :func:`render`, with every field name quoted. Anything
else is a :class:`ColumnTypeError`. A daemon sends every other type (``ENUM``, ``UNION``,
``VARIANT``, ``GEOMETRY``...) as ``VARCHAR``, its values as DuckDB's text.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from trainvigil.errors import QueryError

MAX_TYPE_CHARS = 65_536
"""The longest type text accepted (a STRUCT of a few thousand fields)."""
MAX_DEPTH = 16
"""Nesting accepted (lists of structs of maps...): enough for any table, bounded against a crafted tower."""
MAX_DECIMAL_WIDTH = 38
MAX_ARRAY_SIZE = 100_000
"""DuckDB's own bound on a fixed-size ``ARRAY``."""
MAX_NAME_CHARS = 1024
"""The longest field name accepted in a STRUCT."""


class ColumnTypeError(QueryError, ValueError):
    """A column type that is not one a daemon sends: no SQL is written from it."""


class Scalar(enum.Enum):
    """The types without parameters, each named as DuckDB writes it."""

    BOOLEAN = "BOOLEAN"
    TINYINT = "TINYINT"
    SMALLINT = "SMALLINT"
    INTEGER = "INTEGER"
    BIGINT = "BIGINT"
    HUGEINT = "HUGEINT"
    UTINYINT = "UTINYINT"
    USMALLINT = "USMALLINT"
    UINTEGER = "UINTEGER"
    UBIGINT = "UBIGINT"
    UHUGEINT = "UHUGEINT"
    BIGNUM = "BIGNUM"
    FLOAT = "FLOAT"
    DOUBLE = "DOUBLE"
    VARCHAR = "VARCHAR"
    JSON = "JSON"
    BLOB = "BLOB"
    BIT = "BIT"
    UUID = "UUID"
    DATE = "DATE"
    TIME = "TIME"
    TIME_NS = "TIME_NS"
    TIMETZ = "TIME WITH TIME ZONE"
    TIMESTAMP = "TIMESTAMP"
    TIMESTAMP_S = "TIMESTAMP_S"
    TIMESTAMP_MS = "TIMESTAMP_MS"
    TIMESTAMP_NS = "TIMESTAMP_NS"
    TIMESTAMPTZ = "TIMESTAMP WITH TIME ZONE"
    TIMESTAMPTZ_NS = "TIMESTAMPTZ_NS"
    INTERVAL = "INTERVAL"
    NULL = '"NULL"'
    """The type of a bare ``NULL`` (``SELECT NULL``)."""


@dataclass(frozen=True, slots=True)
class Decimal:
    """``DECIMAL(width,scale)``: ``1 <= width <= 38``, ``0 <= scale <= width``."""

    width: int
    scale: int


@dataclass(frozen=True, slots=True)
class List:
    """``T[]``: a list of any length."""

    child: SqlType


@dataclass(frozen=True, slots=True)
class Array:
    """``T[N]``: exactly ``size`` elements, ``1 <= size <= 100000``."""

    child: SqlType
    size: int


@dataclass(frozen=True, slots=True)
class Struct:
    """``STRUCT(name T, ...)``: named fields, at least one, names distinct regardless of case."""

    fields: tuple[tuple[str, SqlType], ...]


@dataclass(frozen=True, slots=True)
class Map:
    """``MAP(K, V)``."""

    key: SqlType
    value: SqlType


SqlType = Scalar | Decimal | List | Array | Struct | Map
"""A column type a daemon sends, as a value: SQL is written from it by :func:`render`, never from text."""

_WORD = re.compile(r"[A-Z][A-Z_]*")
_NUMBER = re.compile(r"[0-9]{1,6}")
_BARE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUOTED_NAME = re.compile(r'"((?:[^"]|"")*)"')
_ZONED = " WITH TIME ZONE"
_BY_NAME = {s.value: s for s in Scalar}


def quote_identifier(name: str) -> str:
    """``name`` as a SQL identifier in double quotes: every character stands for itself (``"`` doubled)."""
    return '"' + name.replace('"', '""') + '"'


def render(t: SqlType) -> str:
    """``t`` as DuckDB's SQL writes it (``CAST(x AS <this>)``), field names quoted."""
    match t:
        case Scalar():
            return t.value
        case Decimal(width, scale):
            return f"DECIMAL({width},{scale})"
        case List(child):
            return f"{render(child)}[]"
        case Array(child, size):
            return f"{render(child)}[{size}]"
        case Struct(fields):
            return "STRUCT(" + ", ".join(f"{quote_identifier(name)} {render(field)}" for name, field in fields) + ")"
        case Map(key, value):
            return f"MAP({render(key)}, {render(value)})"
    raise TypeError(f"not a column type: {t!r}")  # pragma: no cover - the match is exhaustive


def parse_type(text: str) -> SqlType:
    """The column type DuckDB names ``text`` (as an answer carries it).

    Raises:
        ColumnTypeError: ``text`` is not exactly one of the types a daemon sends; the message quotes
            the start of it and says where it stopped making sense.
    """
    if len(text) > MAX_TYPE_CHARS:
        raise ColumnTypeError(f"a column type of {len(text)} characters is not one a vigil daemon sends")
    parser = _Parser(text)
    t = parser.type(0)
    if parser.pos != len(text):
        raise parser.error("nothing may follow the type")
    return t


def is_known(text: str) -> bool:
    """Whether ``text`` is a type :func:`parse_type` accepts (the daemon sends any other as ``VARCHAR``)."""
    try:
        parse_type(text)
    except ColumnTypeError:
        return False
    return True


class _Parser:
    """Recursive descent over one type's text; ``pos`` is where it stands."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, why: str) -> ColumnTypeError:
        shown = self.text if len(self.text) <= 80 else self.text[:80] + "..."
        return ColumnTypeError(f"{shown!r} is not a column type a vigil daemon sends ({why}, at character {self.pos})")

    def _take(self, literal: str) -> bool:
        if self.text.startswith(literal, self.pos):
            self.pos += len(literal)
            return True
        return False

    def _expect(self, literal: str) -> None:
        if not self._take(literal):
            raise self.error(f"expected {literal!r}")

    def _match(self, pattern: re.Pattern[str], what: str) -> re.Match[str]:
        found = pattern.match(self.text, self.pos)
        if found is None:
            raise self.error(f"expected {what}")
        self.pos = found.end()
        return found

    def _number(self, low: int, high: int, what: str) -> int:
        start = self.pos
        value = int(self._match(_NUMBER, what).group())
        if not low <= value <= high:
            self.pos = start
            raise self.error(f"{what} must be {low}..{high}, not {value}")
        return value

    def _spaces(self) -> None:
        while self._take(" "):
            pass

    def type(self, depth: int) -> SqlType:
        if depth > MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH}")
        t = self._base(depth)
        while self._take("["):
            depth += 1
            if depth > MAX_DEPTH:
                raise self.error(f"nested deeper than {MAX_DEPTH}")
            if self._take("]"):
                t = List(t)
            else:
                t = Array(t, self._number(1, MAX_ARRAY_SIZE, "an array size"))
                self._expect("]")
        return t

    def _base(self, depth: int) -> SqlType:
        if self._take(Scalar.NULL.value):
            return Scalar.NULL
        word = self._match(_WORD, "a type name").group()
        if word in ("TIME", "TIMESTAMP") and self._take(_ZONED):
            word += _ZONED
        if word == "DECIMAL":
            self._expect("(")
            width = self._number(1, MAX_DECIMAL_WIDTH, "a DECIMAL width")
            self._expect(",")
            self._spaces()
            scale = self._number(0, width, "a DECIMAL scale")
            self._expect(")")
            return Decimal(width, scale)
        if word == "STRUCT":
            return Struct(self._fields(depth))
        if word == "MAP":
            self._expect("(")
            key = self.type(depth + 1)
            self._expect(",")
            self._spaces()
            value = self.type(depth + 1)
            self._expect(")")
            return Map(key, value)
        scalar = _BY_NAME.get(word)
        if scalar is None:
            self.pos -= len(word)
            raise self.error(f"{word[:40]!r} is not among the types a daemon sends")
        return scalar

    def _fields(self, depth: int) -> tuple[tuple[str, SqlType], ...]:
        self._expect("(")
        fields: list[tuple[str, SqlType]] = []
        seen: set[str] = set()
        while True:
            name = self._name()
            if name.lower() in seen:
                raise self.error(f"field {name[:40]!r} twice")
            seen.add(name.lower())
            self._expect(" ")
            fields.append((name, self.type(depth + 1)))
            if self._take(")"):
                return tuple(fields)
            self._expect(",")
            self._spaces()

    def _name(self) -> str:
        if self.text.startswith('"', self.pos):
            name = self._match(_QUOTED_NAME, "a quoted field name").group(1).replace('""', '"')
        else:
            name = self._match(_BARE_NAME, "a field name").group()
        if not 1 <= len(name) <= MAX_NAME_CHARS:
            raise self.error(f"a field name must have 1..{MAX_NAME_CHARS} characters")
        return name
