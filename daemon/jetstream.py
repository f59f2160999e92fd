"""Create or check the ``VIGIL`` stream and (re)bind the daemon's durable pull consumer."""

from __future__ import annotations

import contextlib

import structlog
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError
from trainvigil.schemas import STREAM_SUBJECTS

from .config import StreamConfig

log = structlog.get_logger("trainvigil.jetstream")


async def ensure_stream(js: JetStreamContext, cfg: StreamConfig) -> api.StreamInfo:
    """The stream with our subjects and limits, created or updated to match ``cfg``."""
    config = api.StreamConfig(
        name=cfg.name,
        subjects=STREAM_SUBJECTS,
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        max_age=cfg.max_age_s,
        max_bytes=cfg.max_bytes,
        duplicate_window=cfg.duplicate_window_s,
        discard=api.DiscardPolicy.OLD,
    )
    try:
        info = await js.stream_info(cfg.name)
    except NotFoundError:
        info = await js.add_stream(config)
        log.info("stream_created", stream=cfg.name, subjects=STREAM_SUBJECTS)
        return info
    current = info.config
    if (
        sorted(current.subjects or []) != sorted(STREAM_SUBJECTS)
        or current.max_age != cfg.max_age_s
        or current.max_bytes != cfg.max_bytes
    ):
        info = await js.update_stream(config)
        log.info("stream_updated", stream=cfg.name, max_age_s=cfg.max_age_s, max_bytes=cfg.max_bytes)
    return info


async def bind_consumer(js: JetStreamContext, cfg: StreamConfig, after_seq: int) -> JetStreamContext.PullSubscription:
    """A durable pull consumer that delivers from ``after_seq + 1`` on, in stream order.

    The DuckDB offset is the truth: the consumer is recreated from it on every start, so
    messages fetched but never committed by a killed daemon come again, in order, before
    anything newer (a consumer left as it was would only redeliver them after ``ack_wait``,
    behind newer messages).
    """
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(cfg.name, cfg.consumer)
    config = api.ConsumerConfig(
        durable_name=cfg.consumer,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=300.0,
        max_ack_pending=100_000,
        max_waiting=16,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if after_seq else api.DeliverPolicy.ALL,
        opt_start_seq=after_seq + 1 if after_seq else None,
    )
    await js.add_consumer(cfg.name, config)
    log.info("consumer_bound", consumer=cfg.consumer, start_seq=after_seq + 1)
    return await js.pull_subscribe_bind(cfg.consumer, cfg.name)
