"""One daemon per stream and consumer on a broker: who holds them, asked and answered over NATS.

Two daemons on one durable consumer split its messages between them: each stores some runs' steps, the
other sees the gaps as ``data_loss`` (evicted), and each start rebinds the consumer under the other. So
every daemon answers on its namespace's holders subject (``vigil.v1.ctl.sql.daemons``,
:attr:`~trainvigil.schemas.subjects.Subjects.holders`) with a :class:`Holder` (host, pid, data dir, start time,
its stream and consumer), and before it touches the stream a starting daemon asks there and refuses to start
when another one holds its stream and consumer (:class:`ConsumerHeldError`). Shards hold a stream and
consumer each (``<name>-INDEX``), so shards of one deployment never clash, two daemons of one index do.

The claim is the holder's live connection, not a lock with a time to live: a daemon that is SIGKILLed
(or whose host is gone) answers nothing, so the next start, of the same data dir or another, goes ahead
at once; a daemon that does not answer within :data:`LOOK_S` counts as gone.

Daemons starting at the same moment see each other too: each asks with its own :class:`Holder`, and a
starting daemon notes both the answers and the requests it gets. Whatever the order of their
subscriptions, at least one sees the other; of two that are both starting, the earlier start
(:meth:`Holder.rank`) goes on and the other refuses, and one that sees a holder already running refuses.

The question is asked in the daemon's namespace: daemons of other namespaces on the broker never see it,
and run side by side (each with its own stream); two of one namespace are refused as above.

``vigil sql`` asks the same subject (a reader may publish under the query subject) to say which data
dir answered (:func:`unsharded_holder`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec
import nats.errors
from anyio.abc import TaskStatus
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from trainvigil.daemon.config import DaemonConfig
from trainvigil.errors import ConfigError
from trainvigil.schemas.redact import redact_url
from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, Subjects

if TYPE_CHECKING:
    from trainvigil.daemon.metrics import DaemonMetrics

LOOK_S = 0.5
"""How long a starting daemon collects answers: a daemon that is up answers within a round trip."""
RECHECK_S = (10.0, 2.0)
"""A holding daemon asks again every first seconds, collecting answers for the second: a holder that was
too busy to answer a newcomer in time (or cut off from it by a partition) is found then, and of two
holders the later (:meth:`Holder.rank`) stops."""


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    """A daemon, as it names itself on its namespace's holders subject (every field has a default: a request
    from ``vigil sql`` carries none)."""

    stream: str = ""
    consumer: str = ""
    shard: str = ""
    """``I/N`` of a shard; empty for an unsharded daemon."""
    host: str = ""
    pid: int = 0
    data_dir: str = ""
    """Absolute, as the daemon resolved it on its host."""
    started_at: float = 0.0
    """Unix time the daemon started (its host's clock)."""
    nonce: str = ""
    """Random, per start: tells a daemon its own messages and breaks ties of ``started_at``."""
    holding: bool = False
    """False while it is still looking for another holder at start."""

    def rank(self) -> tuple[float, str]:
        """Which of two daemons starting together goes on: the lower."""
        return (self.started_at, self.nonce)

    def same_claim(self, other: Holder) -> bool:
        """Whether ``other`` is another daemon for this one's stream and consumer."""
        same = (other.stream, other.consumer) == (self.stream, self.consumer)
        return same and bool(self.nonce) and other.nonce != self.nonce

    def describe(self) -> str:
        since = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"pid {self.pid} on {self.host}, data dir {self.data_dir}, up since {since}"


class ConsumerHeldError(ConfigError):
    """Another daemon holds this daemon's stream and consumer on the broker; ``holder`` is that daemon."""

    def __init__(self, message: str, *, holder: Holder) -> None:
        super().__init__(message, key="nats_url")
        self.holder = holder


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Holder)


def _decode(data: bytes) -> Holder | None:
    if not data:
        return None
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError:  # not a daemon's request (or a bad one): answered, never counted as a claim
        return None


def this_daemon(config: DaemonConfig) -> Holder:
    """How the daemon of ``config`` (as it runs: :meth:`DaemonConfig.for_shard`) names itself."""
    shard = config.shard_id
    return Holder(
        stream=config.stream.name,
        consumer=config.stream.consumer,
        shard=str(shard) if shard is not None else "",
        host=socket.gethostname(),
        pid=os.getpid(),
        data_dir=str(Path(config.data_dir).resolve()),
        started_at=time.time(),
        nonce=os.urandom(8).hex(),
    )


async def ask(
    nc: NATS,
    me: Holder | None = None,
    look_s: float = LOOK_S,
    *,
    until: Callable[[Holder], bool] | None = None,
    subjects: Subjects = DEFAULT_SUBJECTS,
) -> list[Holder]:
    """The daemons of ``subjects``' namespace that answer on ``nc`` within ``look_s`` (or until one answers
    that ``until`` accepts), ``me`` left out.

    ``me`` travels with the request, so daemons that are starting themselves see this one too.
    """
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    found: list[Holder] = []
    try:
        await nc.publish(subjects.holders, _encoder.encode(me) if me is not None else b"", reply=inbox)
        with anyio.move_on_after(look_s):
            async for msg in sub.messages:
                holder = _decode(msg.data)
                if holder is not None and (me is None or holder.nonce != me.nonce):
                    found.append(holder)
                    if until is not None and until(holder):
                        break
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    return found


async def unsharded_holder(nc: NATS, look_s: float = 1.0, subjects: Subjects = DEFAULT_SUBJECTS) -> Holder | None:
    """The unsharded daemon of ``subjects``' namespace that answers who it is (the one that answers ``vigil sql``
    on the query subject), or ``None`` (none answers, or only a daemon older than this question)."""
    found = await ask(nc, look_s=look_s, until=lambda h: not h.shard, subjects=subjects)
    return next((h for h in found if not h.shard), None)


def _rival(me: Holder, seen: list[Holder]) -> Holder | None:
    """The daemon that keeps ``me`` from holding its stream and consumer: while ``me`` starts, one that holds
    them, else one starting for them ahead of ``me``; once ``me`` holds them, one that holds them ahead of it."""
    claims = [h for h in seen if me.same_claim(h)]
    ahead = [h for h in claims if h.rank() < me.rank() and (h.holding or not me.holding)]
    holding = None if me.holding else next((h for h in claims if h.holding), None)
    return holding or min(ahead, key=Holder.rank, default=None)


def _refusal(me: Holder, rival: Holder, url: str) -> ConsumerHeldError:
    what = f"shard {me.shard}" if me.shard else f"the stream {me.stream} (consumer {me.consumer})"
    where = f"on the broker at {redact_url(url)} by another daemon ({rival.describe()})"
    if me.holding:
        said = f"{what} is also served {where}, which held it first but did not answer when this one started; stopping"
    else:
        said = f"{what} is {'already served' if rival.holding else 'being taken at this moment'} {where}"
    return ConsumerHeldError(
        f"{said}; run one daemon per broker: query that one (vigil sql --nats URL) or stop it first, give this one "
        "another broker (--nats URL, or --embedded-port for a bundled one of its own), or split runs over shards "
        "(--shard I/N, one daemon per shard index)",
        holder=rival,
    )


class _Claim:
    """A daemon's answer on its namespace's holders subject, and the rivals it saw while starting."""

    def __init__(self, nc: NATS, me: Holder, metrics: DaemonMetrics) -> None:
        self.nc = nc
        self.me = me
        self.seen: list[Holder] = []
        # The daemon's side only, imported here: vigil sql imports this module for unsharded_holder() alone.
        from trainvigil.daemon.broker.replies import Replies

        self._replies = Replies(nc, metrics, "holders")

    async def on_request(self, msg: Msg) -> None:
        other = _decode(msg.data)
        if other is not None and other.nonce == self.me.nonce:
            return  # its own question, echoed back
        if self._replies.asker(msg.reply) is None:
            return
        if other is not None and not self.me.holding and self.me.same_claim(other):
            self.seen.append(other)  # another daemon starting now: it may not have seen this one
        with contextlib.suppress(nats.errors.Error):
            await self.nc.publish(msg.reply, _encoder.encode(self.me))


async def hold(
    nc: NATS,
    config: DaemonConfig,
    url: str,
    metrics: DaemonMetrics,
    *,
    look_s: float = LOOK_S,
    recheck_s: tuple[float, float] = RECHECK_S,
    task_status: TaskStatus[Holder] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Claim ``config``'s stream and consumer on the broker, then answer who holds them until cancelled,
    asking again now and then (:data:`RECHECK_S`).

    Raises:
        ConsumerHeldError: another daemon holds them, or is starting for them ahead of this one; or, later,
            another one turned out to hold them since before this one.
    """
    import structlog  # the daemon's side only, as Replies

    log = structlog.get_logger("trainvigil.holders")
    claim = _Claim(nc, this_daemon(config), metrics)
    subjects = config.subjects
    sub = await nc.subscribe(subjects.holders, cb=claim.on_request)
    try:
        await nc.flush()  # subscribed before asking: a daemon asking from now on finds this one
        claim.seen += await ask(nc, claim.me, look_s, subjects=subjects)
        if rival := _rival(claim.me, claim.seen):
            raise _refusal(claim.me, rival, url)
        claim.me = msgspec.structs.replace(claim.me, holding=True)
        log.info("consumer_held", stream=claim.me.stream, consumer=claim.me.consumer, shard=claim.me.shard or None)
        task_status.started(claim.me)
        every, look_again_s = recheck_s
        while True:
            await anyio.sleep(every)
            try:
                seen = await ask(nc, claim.me, look_again_s, subjects=subjects)
            except nats.errors.Error as exc:  # the broker is away (reconnecting): ask next time
                log.debug("holders_not_asked", error=repr(exc))
                continue
            if rival := _rival(claim.me, seen):
                log.error(
                    "consumer_held_twice", stream=claim.me.stream, consumer=claim.me.consumer, by=rival.describe()
                )
                raise _refusal(claim.me, rival, url)
    finally:
        with anyio.CancelScope(shield=True), contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
