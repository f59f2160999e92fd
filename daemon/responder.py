"""Answer ``vigil sql`` requests over NATS request/reply from the daemon's own database."""

from __future__ import annotations

import contextlib

import anyio
import msgspec
import nats.errors
import structlog
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from trainvigil.schemas import QUERY_SUBJECT

from .config import DaemonConfig
from .metrics import DaemonMetrics
from .query import QueryRequest, QueryResult, answer, split_result
from .store import Store

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
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve queries one at a time until cancelled (the writer keeps writing meanwhile)."""
    sub = await nc.subscribe(QUERY_SUBJECT, queue="vigil-query")
    task_status.started()
    try:
        async for msg in sub.messages:
            try:
                await _answer(msg, store, config, metrics)
            except Exception as exc:  # one bad request never takes the daemon down
                log.exception("query_failed", error=repr(exc))
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


async def _answer(msg: Msg, store: Store, config: DaemonConfig, metrics: DaemonMetrics) -> None:
    try:
        request = _request_decoder.decode(msg.data)
    except msgspec.MsgspecError as exc:
        result = QueryResult(error=f"bad query request: {exc}", refused=True)
    else:
        cursor = store.cursor()
        try:
            result = await anyio.to_thread.run_sync(
                answer, cursor, request, config.query_row_limit, config.query_timeout_s
            )
        finally:
            cursor.close()
    outcome = "refused" if result.refused else "error" if result.error else "ok"
    metrics.queries[outcome] += 1
    log.info("query", outcome=outcome, rows=len(result.rows), error=result.error or None)
    if msg.reply:
        for part in split_result(result, _PART_BYTES):
            await msg._client.publish(msg.reply, _encoder.encode(part))
