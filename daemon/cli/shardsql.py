"""``vigil sql`` across shards: the roll call that finds them, and the merge of their answers.

The client never needs the shard count: every sharded daemon answers the roll call
(``vigil.v1.ctl.sql.shards``) with its ``INDEX/COUNT``, so one answer is enough to know which
shards should be there, and a shard that is down is *named*, never silently missing. Each shard is
asked its part of the query (:mod:`trainvigil.daemon.shards`) on its own subject, all at once, under one
deadline; the answers are loaded into an in-memory DuckDB and the merge query runs there with the
same budgets (rows, bytes, time) as a daemon's query.

What a shard answers is data, never SQL: its column types are parsed into values
(:mod:`trainvigil.schemas.sqltypes`) and the casts written from those, names quoted, in a DuckDB
that cannot reach files or the network (:mod:`trainvigil.daemon.sandbox`). Who may answer is the broker's to say:
with ``vigil up --auth`` only the daemon role may; on a bus without credentials any local process
can, and a command that merges says so on stderr (:data:`OPEN_BUS_WARNING`).

A partial answer (a shard missing) is still printed, with a warning naming the missing shards on
stderr, and ``vigil sql`` exits with ``EXIT_PARTIAL`` (5) so a script never takes a partial count
for the total.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import duckdb
import msgspec
import nats.errors
import pyarrow as pa
from nats.aio.client import Client as NATS

from trainvigil.daemon.sandbox import sandboxed
from trainvigil.daemon.shards import PARTIALS, ShardPlan
from trainvigil.daemon.store.query import DEFAULT_MAX_BYTES, run_query
from trainvigil.errors import QueryBusyError, QueryError, QueryRefusedError
from trainvigil.schemas.credentials import BusAccess
from trainvigil.schemas.natsurl import parse_nats_url
from trainvigil.schemas.query import QueryResult
from trainvigil.schemas.shards import ShardId
from trainvigil.schemas.sqltypes import ColumnTypeError, SqlType, quote_identifier, render
from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, Subjects

ROLL_CALL_S = 1.0
"""How long the roll call waits for shards that have not answered yet (one answer tells how many there are)."""

_roll_decoder = msgspec.msgpack.Decoder(tuple[int, int])

OPEN_BUS_WARNING = (
    "vigil: warning: this answer merges shards' answers from a bus without credentials, where any local "
    "process can answer as a shard; secure the bus with `vigil up --auth` (and pass --creds)"
)
"""Said once on stderr by a command that merges shards' answers without credentials (see :mod:`.sqlclient`)."""
_IMPOSTOR = (
    "nothing it sent was run. Only vigil daemons of this version answer the roll call (vigil.v1.ctl.sql.shards, "
    "in a namespace N.vigil.v1.ctl.sql.shards): find what else answers there, and secure the bus with "
    "`vigil up --auth`"
)


@dataclass(slots=True)
class Gathered:
    """The shards' answers to one query, and the shards that did not give one (with why)."""

    count: int
    answers: dict[int, QueryResult] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)

    def missing_names(self) -> list[str]:
        return [f"{i}/{self.count}" for i in sorted(self.missing)]

    def warning(self) -> str:
        """One line for stderr: which shards are missing and why, so the answer is read as partial."""
        why = "; ".join(f"shard {i}/{self.count}: {self.missing[i]}" for i in sorted(self.missing))
        return (
            f"partial answer: {len(self.missing)} of {self.count} shards did not answer ({why}); "
            f"the rows of the runs they hold are missing"
        )


async def roll_call(
    nc: NATS, wait_s: float = ROLL_CALL_S, *, subjects: Subjects = DEFAULT_SUBJECTS
) -> tuple[int, set[int]] | None:
    """The shard count and the indexes that answered in ``subjects``' namespace; ``None`` when no sharded daemon
    listens there.

    Raises:
        QueryError: shards disagree about their count (daemons of two deployments on one broker).
    """
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    seen: dict[int, int] = {}
    try:
        await nc.publish(subjects.roll_call, b"", reply=inbox)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while not seen or len(seen) < max(seen.values()):
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                msg = await sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                break
            if msg.headers and msg.headers.get("Status") == "503":
                return None  # nobody subscribed: no shards
            with contextlib.suppress(msgspec.MsgspecError):
                index, count = _roll_decoder.decode(msg.data)
                seen[index] = count
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    if not seen:
        return None
    counts = set(seen.values())
    if len(counts) > 1:
        raise QueryError(
            f"the shards on this broker disagree about their count ({sorted(counts)}): "
            "restart them with one --shard I/N count, or give each deployment its own broker"
        )
    return counts.pop(), set(seen)


def _checked_types(gathered: Gathered) -> list[SqlType]:
    """The column types the merge casts the shards' answers to, parsed; every answer's are checked.

    Raises:
        ColumnTypeError: an answer's types are not ones a daemon sends; names the shard.
        QueryError: an answer's rows or columns do not line up with the others'; names the shard.
    """
    typed: list[SqlType] = []
    width = -1
    for index, answer in sorted(gathered.answers.items()):
        where = f"shard {index}/{gathered.count}"
        try:
            types = answer.column_types()
        except ColumnTypeError as exc:
            raise ColumnTypeError(f"{where}: {exc}; {_IMPOSTOR}") from None
        if width < 0:
            typed, width = types, len(types)
        if len(types) != width or any(len(row) != width for row in answer.rows):
            raise QueryError(f"{where} answered rows or columns that do not line up with {width} columns; {_IMPOSTOR}")
    return typed


def _partials_table(results: list[QueryResult]) -> pa.Table:
    """The shards' answers as one Arrow table (columns by position; values as the wire carried them)."""
    first = results[0]
    if len(set(first.columns)) != len(first.columns):
        raise QueryError(f"across shards an answer's columns need distinct names, not {first.columns}; alias them")
    rows = [row for r in results for row in r.rows]
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in first.columns]
    arrays = []
    for values in columns:
        try:
            arrays.append(pa.array(list(values)))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):  # mixed, past int64: DuckDB casts text
            arrays.append(pa.array([None if v is None else str(v) for v in values], type=pa.string()))
    return pa.table(arrays, names=[f"c{i}" for i in range(len(first.columns))])


def merge(plan: ShardPlan, gathered: Gathered, limit: int, timeout: float, max_bytes: int | None = None) -> QueryResult:
    """The answer: ``plan.merge_sql`` over the shards' answers, within the same row/byte/time budgets.

    The answers are data, never SQL: their column types are parsed (:mod:`trainvigil.schemas.sqltypes`)
    and the casts written from what was parsed, names quoted, in a DuckDB that cannot reach files or
    the network (:mod:`trainvigil.daemon.sandbox`).

    Raises:
        QueryError: a shard's answer was an error or not a daemon's answer (named), or the merge query failed.
    """
    for index, answer in sorted(gathered.answers.items()):
        if answer.refused:
            raise QueryRefusedError(f"shard {index}/{gathered.count}: {answer.error}")
        if answer.error:
            raise (QueryBusyError if answer.busy else QueryError)(f"shard {index}/{gathered.count}: {answer.error}")
    types = _checked_types(gathered)
    results = [gathered.answers[i] for i in sorted(gathered.answers)]
    con = sandboxed()
    try:
        con.register("wire", _partials_table(results))
        # Typed as the shards' DuckDB typed them, so the merge computes as they would have.
        casts = ", ".join(
            f"CAST(c{i} AS {render(t)}) AS {quote_identifier(name)}"
            for i, (name, t) in enumerate(zip(results[0].columns, types, strict=True))
        )
        try:
            con.execute(f"CREATE TABLE {PARTIALS} AS SELECT {casts} FROM wire")
        except duckdb.Error as exc:
            raise QueryError(f"the shards' answers do not hold values of the types they name: {exc}") from None
        con.unregister("wire")
        merged = run_query(con, plan.merge_sql, limit, timeout, max_bytes=max_bytes or DEFAULT_MAX_BYTES)
    finally:
        con.close()
    cut = [(i, r) for i, r in sorted(gathered.answers.items()) if r.truncated]
    if cut and not merged.truncated:
        index, shard_answer = cut[0]
        note = (
            f"shard {index}/{gathered.count}'s part was cut ({shard_answer.note or 'truncated'}), so the merged "
            "answer may miss rows; narrow the query (WHERE, fewer groups)"
        )
        merged = msgspec.structs.replace(merged, truncated=True, truncated_by=shard_answer.truncated_by, note=note)
    return merged


def open_bus(url: str, access: BusAccess) -> bool:
    """Whether this client connects without credentials (no file, no user in the URL): then nothing tells a
    shard from any other local process. With ``vigil up --auth`` only the daemon role may subscribe to the
    roll call and the shards' subjects (:mod:`trainvigil.daemon.broker.auth`)."""
    return not access.creds and not parse_nats_url(url).has_user


def shard_ids(count: int, indexes: set[int], subjects: Subjects = DEFAULT_SUBJECTS) -> list[ShardId]:
    """The shards to ask: those of ``subjects``' namespace that answered the roll call."""
    return [ShardId(i, count, subjects) for i in sorted(indexes)]
