"""The query wire: a read-only SQL request to the daemon and its answer, split to fit NATS messages."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from trainvigil.errors import QueryRefusedError

from .sqltypes import ColumnTypeError, SqlType, parse_type

MAX_SQL_CHARS = 100_000
"""Characters in one query's SQL."""


class QueryRequest(msgspec.Struct, frozen=True):
    """A query and the budgets its answer asks for (``None``: the daemon's; more is lowered to it).

    Out-of-range fields (a negative ``limit``, an empty ``max_bytes``, a ``timeout_s`` of 0) fail
    decoding, so the daemon answers them at once.
    """

    sql: Annotated[str, msgspec.Meta(max_length=MAX_SQL_CHARS)]
    limit: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_bytes: Annotated[int, msgspec.Meta(ge=1)] | None = None
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None


class QueryResult(msgspec.Struct, frozen=True):
    """An answer: column names and types, rows, and whether a budget cut it short (``note`` says which)."""

    columns: list[str] = []
    types: list[str] = []
    rows: list[list[Any]] = []
    truncated: bool = False
    error: str = ""
    refused: bool = False
    busy: bool = False
    """Every ``query_concurrency`` slot was taken: nothing ran; ask again in a moment."""
    more: bool = False
    """On the wire: more parts of this answer follow (answers are split to fit NATS messages)."""
    note: str = ""
    """Why the answer was cut: ``truncated at N rows ...`` or ``truncated at N bytes ...``."""
    truncated_by: Literal["", "rows", "bytes"] = ""
    """Which budget cut the answer: ``rows`` (the row limit) or ``bytes`` (``query_max_bytes``); empty when
    it is whole. A daemon older than this field sends only ``truncated`` and ``note``."""

    def column_types(self) -> list[SqlType]:
        """``types`` parsed (:func:`~trainvigil.schemas.sqltypes.parse_type`): the only form SQL is written from.

        Raises:
            ColumnTypeError: a type is not one a daemon sends, or there is not one type per column.
        """
        if len(self.types) != len(self.columns):
            raise ColumnTypeError(f"the answer has {len(self.columns)} columns but {len(self.types)} column types")
        return [parse_type(t) for t in self.types]


def validate(request: QueryRequest) -> QueryRequest:
    """``request`` checked as the daemon decodes it (a constructed Struct skips its constraints).

    Raises:
        QueryRefusedError: a field is out of range; the message names it.
    """
    try:
        return msgspec.convert(msgspec.structs.asdict(request), QueryRequest)
    except msgspec.ValidationError as exc:
        raise QueryRefusedError(f"bad query request: {exc}") from None


def split_result(result: QueryResult, max_bytes: int) -> list[QueryResult]:
    """``result`` as parts whose encoded size stays under ``max_bytes`` (rows never split)."""
    parts: list[QueryResult] = []
    rows: list[list[Any]] = []
    # Column names, types and flags travel in every part; the array header takes up to 5 bytes.
    overhead = len(msgspec.msgpack.encode(msgspec.structs.replace(result, rows=[], more=True))) + 5
    size = overhead
    for row in result.rows:
        row_size = len(msgspec.msgpack.encode(row))
        if rows and size + row_size > max_bytes:
            parts.append(msgspec.structs.replace(result, rows=rows, truncated=False, more=True))
            rows, size = [], overhead
        rows.append(row)
        size += row_size
    parts.append(msgspec.structs.replace(result, rows=rows, more=False))
    return parts


def join_results(parts: list[QueryResult]) -> QueryResult:
    """The answer whose parts :func:`split_result` made."""
    return msgspec.structs.replace(parts[-1], rows=[row for p in parts for row in p.rows], more=False)
