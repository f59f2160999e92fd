"""Answer ``vigil sql`` requests over NATS request/reply from the daemon's own database.

At most ``query_concurrency`` queries run at once, each on its own connection and thread; a
request beyond that gets a "busy" answer at once rather than waiting in line. Every request
gets an answer, even one that cannot be decoded or whose answer fails to encode, except one whose
reply subject is no asker's inbox (:mod:`trainvigil.daemon.broker.replies`): that one is not run at all.

One client connection (the asker) may ask ``query_rate_per_s`` queries a second, ``query_burst`` at once;
past that it gets a "busy" answer, encoded once and sent without decoding the request or touching
DuckDB, and is logged as one counted line a second at most, so a flood from one reader costs little
and never crowds out another reader's query.
"""

from __future__ import annotations

import contextlib

import anyio
import msgspec
import nats.errors
import structlog
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from trainvigil.daemon.broker.ratelimit import Buckets, Tally
from trainvigil.daemon.broker.replies import Replies
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.daemon.store.reads import ReadOnlyQueries
from trainvigil.daemon.store.writer import Store
from trainvigil.schemas.query import QueryRequest, QueryResult, split_result

log = structlog.get_logger("trainvigil.query")
_request_decoder = msgspec.msgpack.Decoder(QueryRequest)
_encoder = msgspec.msgpack.Encoder()
_PART_BYTES = 512 * 1024  # well under nats-server's default 1 MiB max_payload


async def serve_queries(
    nc: NATS,
    store: Store,
    config: DaemonConfig,
    metrics: DaemonMetrics,
    *,
    subject: str | None = None,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve queries, up to ``config.query_concurrency`` at once, until cancelled (the writer keeps writing).

    ``subject``: where requests come (a shard answers on its own, ``ShardId.query_subject``); ``None``: the
    query subject of ``config``'s namespace.
    On cancellation the queries in flight are interrupted, so shutdown does not wait for them.
    """
    sub = await nc.subscribe(subject or config.subjects.query, queue="vigil-query")
    slots = anyio.Semaphore(config.query_concurrency)
    reads = ReadOnlyQueries(store, config)
    replies = Replies(nc, metrics, "sql")
    rates = Buckets(config.query_rate_per_s, config.query_burst, config.query_askers_max)
    limited = Tally(log, "query_limited")
    too_fast = _encoder.encode(
        QueryResult(
            error=f"busy: this client asked more than {config.query_rate_per_s:g} queries a second, "
            f"{config.query_burst} at once (query_rate_per_s, query_burst); try again in a moment",
            busy=True,
        )
    )
    task_status.started()
    try:
        async with anyio.create_task_group() as tg:
            try:
                async for msg in sub.messages:
                    if (asker := replies.asker(msg.reply)) is None:
                        continue
                    if not rates.take(asker):
                        metrics.queries["limited"] += 1
                        limited.add(asker=asker, why="over query_rate_per_s / query_burst: answered busy")
                        with contextlib.suppress(nats.errors.Error):
                            await nc.publish(msg.reply, too_fast)
                        continue
                    try:
                        slots.acquire_nowait()
                    except anyio.WouldBlock:
                        busy = QueryResult(
                            error=f"busy: {config.query_concurrency} queries are running (query_concurrency); "
                            "try again in a moment",
                            busy=True,
                        )
                        await _reply(nc, msg, busy, metrics, outcome="busy")
                        continue
                    tg.start_soon(_serve_one, nc, msg, reads, metrics, slots)
            finally:
                reads.interrupt()
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


async def _serve_one(
    nc: NATS,
    msg: Msg,
    reads: ReadOnlyQueries,
    metrics: DaemonMetrics,
    slots: anyio.Semaphore,
) -> None:
    try:
        result = await _run(msg, reads)
    except Exception as exc:  # one bad request never takes the daemon down, and still gets an answer
        log.exception("query_failed", error=repr(exc))
        result = QueryResult(error=f"the daemon failed to answer ({exc!r}); see its log")
    finally:
        slots.release()
    try:
        await _reply(nc, msg, result, metrics)
    except Exception as exc:
        log.exception("query_reply_failed", error=repr(exc))
        with contextlib.suppress(Exception):
            await _reply(nc, msg, QueryResult(error=f"the daemon could not send its answer ({exc!r})"), metrics)


async def _run(msg: Msg, reads: ReadOnlyQueries) -> QueryResult:
    try:
        request = _request_decoder.decode(msg.data)
    except msgspec.MsgspecError as exc:
        return QueryResult(error=f"bad query request: {exc}", refused=True)
    return await reads.answer(request)


async def _reply(nc: NATS, msg: Msg, result: QueryResult, metrics: DaemonMetrics, outcome: str = "") -> None:
    outcome = outcome or ("refused" if result.refused else "error" if result.error else "ok")
    metrics.queries[outcome] += 1
    log.info("query", outcome=outcome, rows=len(result.rows), note=result.note or None, error=result.error or None)
    if msg.reply:
        for part in split_result(result, _PART_BYTES):
            await nc.publish(msg.reply, _encoder.encode(part))
