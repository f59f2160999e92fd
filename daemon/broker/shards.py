"""A shard's edge to the broker: check that the broker partitions runs, and answer the roll call.

The partitioning itself is the broker's (``trainvigil.schemas.shards``); a daemon started with
``--shard I/N`` against a broker without the mappings, or with mappings for another N, would sit
idle while agents' messages go to no stream (or to the wrong shard's). So at start the daemon asks
the broker to map a few probe subjects and checks the partitions that come back against its own
N, and refuses to start with a message that says what to configure.
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

from trainvigil.daemon.broker.replies import Replies
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.errors import ConfigError
from trainvigil.schemas.redact import redact_url
from trainvigil.schemas.shards import PROBE_KIND, ShardId, partition_of, probe_subject

log = structlog.get_logger("trainvigil.shards")

PROBES = 32
"""Probe tokens published at start: enough that a mapping for another shard count shows (for N <= 1024,
32 tokens give the same partitions under N and any other count with probability well under 1e-9)."""


def _probe_tokens() -> list[str]:
    return [f"_vigil-probe-{i}" for i in range(PROBES)]


async def check_partitioning(nc: NATS, shard: ShardId, url: str, timeout: float = 3.0) -> None:
    """Publish the probes and compare the partitions the broker gives them with :func:`partition_of`.

    Raises:
        ConfigError: no probe came back mapped (the broker has no ``mappings``), or one came back in
            another partition (the mappings are for another shard count); the message gives the fix.
    """
    seen: dict[str, int] = {}
    unmapped: list[str] = []
    done = anyio.Event()
    tokens = _probe_tokens()

    async def on_probe(msg: Msg) -> None:
        parts = msg.subject.split(".")  # <prefix>.<partition>.<token>.probe
        with contextlib.suppress(ValueError, IndexError):
            seen[parts[-2]] = int(parts[-3])
        if len(seen) >= len(tokens):
            done.set()

    async def on_unmapped(msg: Msg) -> None:  # a probe that kept its subject: no mapping at all
        unmapped.append(msg.subject)
        done.set()

    prefix = shard.subjects.prefix
    subs = [
        await nc.subscribe(f"{prefix}.*.*.{PROBE_KIND}", cb=on_probe),
        await nc.subscribe(probe_subject("*", shard.subjects), cb=on_unmapped),
    ]
    try:
        for token in tokens:
            await nc.publish(probe_subject(token, shard.subjects), b"")
        await nc.flush()
        with anyio.move_on_after(timeout):
            await done.wait()
    finally:
        for sub in subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
    fix = f"put `vigil shards mappings {shard.count}` into every NATS node's configuration and reload it"
    if unmapped or not seen:
        raise ConfigError(
            f"shard {shard}: the broker at {redact_url(url)} does not partition runs (no subject mappings); {fix}",
            key="shard",
        )
    wrong = {t: p for t, p in seen.items() if p != partition_of(t, shard.count)}
    if wrong or len(seen) < len(tokens):
        raise ConfigError(
            f"shard {shard}: the broker at {redact_url(url)} partitions runs over another number of shards than "
            f"{shard.count} ({len(wrong)} of {len(seen)} probes mapped elsewhere); {fix}, or start the daemons "
            "with that count",
            key="shard",
        )
    log.info("partitioning_checked", shard=str(shard), probes=len(seen))


_encoder = msgspec.msgpack.Encoder()


async def answer_roll_call(
    nc: NATS,
    shard: ShardId,
    metrics: DaemonMetrics,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer every roll call with ``[index, count]`` until cancelled, so ``vigil sql`` learns N from
    any shard that is up and can name the ones that are not (in an asker's inbox only, see :mod:`.replies`)."""
    sub = await nc.subscribe(shard.subjects.roll_call)
    replies = Replies(nc, metrics, "roll_call")
    answer = _encoder.encode([shard.index, shard.count])
    task_status.started()
    try:
        async for msg in sub.messages:
            if replies.asker(msg.reply) is not None:
                with contextlib.suppress(nats.errors.Error):
                    await nc.publish(msg.reply, answer)
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
