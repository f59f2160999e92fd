"""Ask a running daemon over NATS; with none answering, read the DuckDB file read-only.

What a query needs only on another path loads there: DuckDB and pyarrow when the file is read (or shards' answers
are merged), the shard planner when no unsharded daemon answers. An answer from one daemon needs the broker client
and msgspec, nothing more of this module's.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import msgspec

from trainvigil.daemon.broker.embedded import port_open
from trainvigil.daemon.cli import _nats
from trainvigil.errors import ConfigError, DaemonUnavailableError, QueryBusyError, QueryError, QueryRefusedError
from trainvigil.schemas.credentials import ANONYMOUS, BusAccess, refusal
from trainvigil.schemas.natsconnect import BusConnectError, ConnectPolicy, connect
from trainvigil.schemas.natsurl import parse_nats_url
from trainvigil.schemas.query import QueryRequest, QueryResult, join_results, validate
from trainvigil.schemas.redact import redact_url
from trainvigil.schemas.settings import retrying
from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, Subjects
from trainvigil.schemas.terminal import terminal_safe

if TYPE_CHECKING:
    import duckdb
    from nats.aio.client import Client as NATS

    from trainvigil.schemas.shards import ShardId

_decoder = msgspec.msgpack.Decoder(QueryResult)
BUSY_PATIENCE_S = 30.0
"""How long a command waits out a busy daemon (every ``query_concurrency`` slot taken) by default."""


class _Connection:
    """A broker connection and the errors the server sent on it (nats-py hands them to a callback)."""

    def __init__(self) -> None:
        self.nc: NATS | None = None
        self.errors: list[Exception] = []

    async def keep(self, exc: Exception) -> None:
        """nats-py prints every error; here they are answers: no broker, or a refusal (said once, by the caller)."""
        self.errors.append(exc)

    def refused(self) -> str | None:
        """Why the server turned this client away, if it did."""
        return next((why for exc in self.errors if (why := refusal(exc))), None)


def _any_listens(servers: Sequence[str]) -> bool:
    """Whether anything accepts TCP connections at one of ``servers`` (a closed port answers at once)."""
    for server in servers:
        parts = urlsplit(server)
        port = parts.port or (4222 if parts.scheme in ("nats", "tls") else None)
        if not parts.hostname or port is None or port_open(parts.hostname, port, timeout=1.0):
            return True  # a websocket URL without a port: let nats-py try it
    return False


async def _connect(url: str, access: BusAccess) -> _Connection | None:
    """A connection to the broker at ``url``, or ``None`` when none answers.

    Raises:
        ConfigError: ``url`` is not a NATS URL; or the broker turned these credentials (or this TLS trust) away:
            said at once, since a wrong password would otherwise read as "no daemon" and fall back to the file.
    """
    parsed = parse_nats_url(url)
    if not await asyncio.to_thread(_any_listens, parsed.servers):
        return None  # refused at once: nats-py would retry a refused first connect until the 3 s bound
    _nats.load_for(parsed)
    conn = _Connection()
    try:
        conn.nc = await connect(parsed, access, ConnectPolicy(connect_timeout=1, deadline=3, error_cb=conn.keep))
    except BusConnectError as exc:
        if exc.refused:
            raise ConfigError(str(exc), key="nats_creds") from None
        return None
    return conn


async def _ask(
    conn: _Connection, url: str, request: QueryRequest, timeout: float, subject: str = DEFAULT_SUBJECTS.query
) -> QueryResult | None:
    """The daemon's answer over ``conn``, or ``None`` when no daemon listens on ``subject``.

    Raises:
        QueryRefusedError: the broker does not let these credentials send queries (an agent's, say).
    """
    import nats.errors

    nc = conn.nc
    assert nc is not None
    parts: list[QueryResult] = []
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(subject, msgspec.msgpack.encode(request), reply=inbox)
        # The server answers a forbidden publish with an error before the next PONG. nats-py sends a
        # flush's PING ahead of what is still queued, so only the second PING surely follows the publish.
        for _ in range(2):
            await nc.flush(timeout=max(1, int(timeout)))
        if why := conn.refused():
            raise QueryRefusedError(f"the broker at {redact_url(url)} refused this query: {why}")
        while not parts or parts[-1].more:
            reply = await sub.next_msg(timeout=timeout)
            if reply.headers and reply.headers.get("Status") == "503":
                return None  # no daemon subscribed
            parts.append(_decoder.decode(reply.data))
    except nats.errors.TimeoutError:
        raise QueryError(f"the daemon at {redact_url(url)} did not answer within {timeout:g} s") from None
    finally:
        await sub.unsubscribe()
    return join_results(parts)


async def data_dir_note(
    conn: _Connection, url: str, data_dir: str | Path, subjects: Subjects = DEFAULT_SUBJECTS
) -> str:
    """One line when the unsharded daemon of ``subjects``' namespace that answers on ``conn`` serves another data
    dir than ``data_dir`` and ``data_dir`` holds a history of its own (the one the user may have meant); else
    ``""``."""
    asked = Path(data_dir).resolve()
    if conn.nc is None or not (asked / "vigil.duckdb").exists():
        return ""
    from trainvigil.daemon.broker.holders import unsharded_holder

    holder = await unsharded_holder(conn.nc, subjects=subjects)
    if holder is None or (holder.data_dir == str(asked) and holder.host == socket.gethostname()):
        return ""
    # What another process on the bus says about itself: made safe to print.
    return terminal_safe(
        f"answered by the daemon at {redact_url(url)} (data dir {holder.data_dir} on {holder.host}), not from "
        f"{asked}: while a daemon answers on the broker, --data-dir is not read; to read {asked}, ask its own "
        "daemon (--nats URL) or stop this one"
    )


async def ask_daemon(
    url: str,
    request: QueryRequest,
    timeout: float,
    access: BusAccess = ANONYMOUS,
    *,
    subjects: Subjects = DEFAULT_SUBJECTS,
) -> QueryResult | None:
    """The answer of the (unsharded) daemon of ``subjects``' namespace, or ``None`` when no broker or no such
    daemon is there."""
    conn = await _connect(url, access)
    if conn is None or conn.nc is None:
        return None
    try:
        return await _ask(conn, url, request, timeout, subjects.query)
    finally:
        await conn.nc.close()


class QuerySource:
    """Where read-only queries are answered: the daemon of ``subjects``' namespace at ``nats_url``, else
    ``data_dir``'s file.

    Decided by the first query and kept for the next ones, so a paged export reads from one place
    (one broker connection, or the file opened once). Use it as a context manager: it holds the
    connection or the file (and its read lock) until it closes.

    Args:
        timeout: seconds to wait for each answer; reading the file, each query's timeout.
        max_bytes: the bytes of encoded rows an answer holds at most (the daemon may lower it).
        access: the reader's credentials and the CA to trust.
        subjects: the namespace whose daemon (or shards) to ask.
    """

    def __init__(
        self,
        *,
        nats_url: str,
        data_dir: str | Path,
        timeout: float,
        max_bytes: int | None = None,
        access: BusAccess = ANONYMOUS,
        busy_patience_s: float = BUSY_PATIENCE_S,
        subjects: Subjects = DEFAULT_SUBJECTS,
    ) -> None:
        self.nats_url = nats_url
        self.subjects = subjects
        self.busy_patience_s = busy_patience_s
        self.access = access
        self.path = Path(data_dir) / "vigil.duckdb"
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.where = ""
        """``daemon at URL``, ``N shards at URL`` (no password shown) or the file's path, once a query was answered."""
        self.missing: list[str] = []
        """Shards (``I/N``) that did not answer the last query: its answer lacks their runs."""
        self.warning = ""
        """What to tell the user about the last answer when it is partial (names the missing shards)."""
        self._shards = False
        self._warned_open_bus = False
        self._runner = asyncio.Runner()
        self._conn: _Connection | None = None
        self._con: duckdb.DuckDBPyConnection | None = None

    @property
    def from_daemon(self) -> bool:
        return self._conn is not None

    def __enter__(self) -> QuerySource:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self._conn is not None and self._conn.nc is not None:
                self._runner.run(self._conn.nc.close())
        finally:
            self._runner.close()
            if self._con is not None:
                self._con.close()
            self._conn, self._con = None, None

    def ask(self, sql: str, limit: int) -> QueryResult:
        """Run ``sql``; the answer holds at most ``limit`` rows (``truncated`` says when it was cut).

        A busy daemon (it answers "busy" at once rather than queueing) is asked again at once, then with
        the pause doubling from 50 ms up to 2 s, for at most ``busy_patience_s`` more: a command must not
        fail because someone else's queries hold every slot for a moment.

        Raises:
            QueryRefusedError: not a read-only query, or ``limit``/``max_bytes`` below 1 (checked
                before anything is sent).
            QueryError: the query failed.
            QueryBusyError: the daemon (or a shard) was still busy after ``busy_patience_s``.
            DaemonUnavailableError: no daemon answered and there is no database file, or the daemon
                that answered before stopped answering.
            duckdb.Error: the file cannot be opened (a daemon holds it, or it is not a database).
        """
        try:
            return self._ask_once(sql, limit)
        except QueryBusyError:
            pass  # asked again under the retry policy, which loads its library only then (a command starts faster)
        for attempt in retrying(
            QueryBusyError, attempts=None, wait_initial=0.05, wait_max=2.0, timeout=self.busy_patience_s
        ):
            with attempt:
                return self._ask_once(sql, limit)
        raise AssertionError("unreachable: retrying returns or raises")  # pragma: no cover

    def _ask_once(self, sql: str, limit: int) -> QueryResult:
        request = validate(QueryRequest(sql=sql, limit=limit, max_bytes=self.max_bytes))
        if self._con is None:
            result = self._ask_daemon(request)
            if result is not None:
                if result.refused:
                    raise QueryRefusedError(result.error)
                if result.error:
                    raise (QueryBusyError if result.busy else QueryError)(result.error)
                return result
        from trainvigil.daemon.store.query import DEFAULT_MAX_BYTES, open_read_only, run_query

        if self._con is None:
            if not self.path.exists():
                raise DaemonUnavailableError(
                    f"no daemon answered at {redact_url(self.nats_url)} and {self.path} does not exist; start one with "
                    "`vigil up` or point --data-dir at a data directory"
                )
            self._con = open_read_only(str(self.path))
            self.where = str(self.path)
        return run_query(self._con, sql, limit, self.timeout, max_bytes=self.max_bytes or DEFAULT_MAX_BYTES)

    def _ask_daemon(self, request: QueryRequest) -> QueryResult | None:
        """The daemon's answer; ``None`` when none answers the first query."""
        first = self._conn is None
        if first:
            self._conn = self._runner.run(_connect(self.nats_url, self.access))
            if self._conn is None or self._conn.nc is None:
                return None
        assert self._conn is not None and self._conn.nc is not None
        result = None
        if not self._shards:
            result = self._runner.run(_ask(self._conn, self.nats_url, request, self.timeout, self.subjects.query))
        if result is None and (first or self._shards):
            # No unsharded daemon: sharded ones answer on their own subjects (see shardsql).
            result = self._runner.run(self._ask_shards(self._conn, request))
            self._shards = result is not None
        if result is None and first:
            self._runner.run(self._conn.nc.close())
            self._conn = None
        elif result is None:
            raise DaemonUnavailableError(
                f"the daemon at {redact_url(self.nats_url)} stopped answering; start it again (`vigil up`) and retry"
            )
        elif not self._shards:
            self.where = f"daemon at {redact_url(self.nats_url)}"
            if first and (
                note := self._runner.run(data_dir_note(self._conn, self.nats_url, self.path.parent, self.subjects))
            ):
                print(f"vigil: {note}", file=sys.stderr, flush=True)
        return result

    async def _ask_shards(self, conn: _Connection, request: QueryRequest) -> QueryResult | None:
        """Every shard's part of ``request``, merged; ``None`` when no sharded daemon answers the roll call.

        Sets :attr:`missing` and :attr:`warning` when a shard is down or does not answer in time.
        """
        from trainvigil.daemon.cli.shardsql import OPEN_BUS_WARNING, Gathered, merge, open_bus, roll_call, shard_ids
        from trainvigil.daemon.config import QUERY_ROW_LIMIT
        from trainvigil.daemon.shards import plan as shard_plan

        nc = conn.nc
        assert nc is not None
        called = await roll_call(nc, subjects=self.subjects)
        if called is None:
            return None
        count, present = called
        plan = shard_plan(request.sql)
        limit = request.limit if plan.shard_limit_follows_user else None
        part = QueryRequest(sql=plan.shard_sql, limit=limit, max_bytes=request.max_bytes)
        gathered = Gathered(count, missing={i: "down (no answer to the roll call)" for i in range(count)})

        async def one(shard: ShardId) -> None:
            try:
                answer = await _ask(conn, self.nats_url, part, self.timeout, subject=shard.query_subject)
            except QueryError as exc:  # its deadline passed
                gathered.missing[shard.index] = str(exc)
                return
            if answer is None:
                gathered.missing[shard.index] = "stopped answering"
                return
            gathered.answers[shard.index] = answer
            gathered.missing.pop(shard.index, None)

        await asyncio.gather(*(one(s) for s in shard_ids(count, present, self.subjects)))
        self.missing, self.warning = gathered.missing_names(), gathered.warning() if gathered.missing else ""
        if not gathered.answers:
            raise DaemonUnavailableError(f"no shard answered at {redact_url(self.nats_url)}: {gathered.warning()}")
        self.where = f"{len(gathered.answers)} of {count} shards at {redact_url(self.nats_url)}"
        if open_bus(self.nats_url, self.access) and not self._warned_open_bus:
            self._warned_open_bus = True
            print(OPEN_BUS_WARNING, file=sys.stderr, flush=True)
        return merge(plan, gathered, request.limit or QUERY_ROW_LIMIT, self.timeout, request.max_bytes)


def query(
    sql: str,
    *,
    nats_url: str,
    data_dir: str | Path,
    limit: int,
    timeout: float = 60.0,
    max_bytes: int | None = None,
    access: BusAccess = ANONYMOUS,
    subjects: Subjects = DEFAULT_SUBJECTS,
) -> tuple[QueryResult, str]:
    """Run one read-only query (see :class:`QuerySource`); returns the result and where it was answered.

    Args:
        limit, max_bytes: rows and bytes the answer holds at most (the daemon may lower them).
        timeout: seconds to wait for the daemon's answer; reading the file, the query's timeout.
        access: the reader's credentials and the CA to trust.
        subjects: the namespace whose daemon to ask.
    """
    source = QuerySource(
        nats_url=nats_url, data_dir=data_dir, timeout=timeout, max_bytes=max_bytes, access=access, subjects=subjects
    )
    with source:
        return source.ask(sql, limit), source.where
