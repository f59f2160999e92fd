"""Ask a running daemon over NATS; with none answering, read the DuckDB file read-only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import nats
import nats.errors

from trainvigil.daemon.store.query import DEFAULT_MAX_BYTES, open_read_only, run_query
from trainvigil.errors import DaemonUnavailableError, QueryError, QueryRefusedError
from trainvigil.schemas import QUERY_SUBJECT
from trainvigil.schemas.query import QueryRequest, QueryResult, join_results, validate

_decoder = msgspec.msgpack.Decoder(QueryResult)


async def _quiet(exc: Exception) -> None:
    """nats-py prints every connection error; here a missing broker is an expected answer."""


async def ask_daemon(url: str, request: QueryRequest, timeout: float) -> QueryResult | None:
    """The daemon's answer, or ``None`` when no broker or no daemon is there."""
    try:
        nc = await asyncio.wait_for(
            nats.connect(url, connect_timeout=1, max_reconnect_attempts=0, allow_reconnect=False, error_cb=_quiet),
            timeout=3,
        )
    except (TimeoutError, OSError, nats.errors.Error):
        return None
    parts: list[QueryResult] = []
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(QUERY_SUBJECT, msgspec.msgpack.encode(request), reply=inbox)
        while not parts or parts[-1].more:
            reply = await sub.next_msg(timeout=timeout)
            if reply.headers and reply.headers.get("Status") == "503":
                return None  # no daemon subscribed
            parts.append(_decoder.decode(reply.data))
    except nats.errors.TimeoutError:
        raise QueryError(f"the daemon at {url} did not answer within {timeout:g} s") from None
    finally:
        await nc.close()
    return join_results(parts)


def query(
    sql: str,
    *,
    nats_url: str,
    data_dir: str | Path,
    limit: int,
    timeout: float = 60.0,
    max_bytes: int | None = None,
) -> tuple[QueryResult, str]:
    """Run a read-only query; returns the result and where it was answered.

    Args:
        limit, max_bytes: rows and bytes the answer holds at most (the daemon may lower them).
        timeout: seconds to wait for the daemon's answer; reading the file, the query's timeout.

    Raises:
        QueryRefusedError: not a read-only query, or ``limit``/``max_bytes`` below 1 (checked
            before anything is sent).
        QueryError: the query failed.
        DaemonUnavailableError: no daemon answered and there is no database file.
    """
    request = validate(QueryRequest(sql=sql, limit=limit, max_bytes=max_bytes))
    result = asyncio.run(ask_daemon(nats_url, request, timeout))
    if result is not None:
        if result.refused:
            raise QueryRefusedError(result.error)
        if result.error:
            raise QueryError(result.error)
        return result, f"daemon at {nats_url}"
    path = Path(data_dir) / "vigil.duckdb"
    if not path.exists():
        raise DaemonUnavailableError(
            f"no daemon answered at {nats_url} and {path} does not exist; start one with `vigil up` "
            "or point --data-dir at a data directory"
        )
    con = open_read_only(str(path))
    try:
        return run_query(con, sql, limit, timeout, max_bytes=max_bytes or DEFAULT_MAX_BYTES), str(path)
    finally:
        con.close()
