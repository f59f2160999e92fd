"""Create or check the ``VIGIL`` stream, (re)bind the daemon's durable pull consumer, pull from it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import anyio
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from trainvigil.daemon.config import StreamConfig
from trainvigil.errors import ConfigError
from trainvigil.schemas import DEFAULT_SUBJECTS

log = structlog.get_logger("trainvigil.jetstream")


async def ensure_stream(
    js: JetStreamContext, cfg: StreamConfig, subjects: Sequence[str] = DEFAULT_SUBJECTS.stream_subjects
) -> api.StreamInfo:
    """The stream with ``subjects`` (every run's, or one shard's partition) and ``cfg``'s limits and
    replicas, created or updated to match."""
    subjects = list(subjects)
    config = api.StreamConfig(
        name=cfg.name,
        subjects=subjects,
        num_replicas=cfg.replicas,
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        max_age=cfg.max_age_s,
        max_bytes=cfg.max_bytes,
        duplicate_window=cfg.duplicate_window_s,
        discard=api.DiscardPolicy.NEW if cfg.discard == "new" else api.DiscardPolicy.OLD,
        max_msgs_per_subject=cfg.max_msgs_per_subject,
        discard_new_per_subject=cfg.discard == "new" and cfg.max_msgs_per_subject > 0,
    )
    try:
        info = await js.stream_info(cfg.name)
    except NotFoundError:
        with _storage_refusal(cfg):
            info = await js.add_stream(config)
        log.info("stream_created", stream=cfg.name, subjects=subjects, replicas=cfg.replicas)
        return info
    current = info.config
    if (
        sorted(current.subjects or []) != sorted(subjects)
        or (current.num_replicas or 1) != cfg.replicas
        or current.max_age != cfg.max_age_s
        or current.max_bytes != cfg.max_bytes
        or current.discard != config.discard
        or current.max_msgs_per_subject != config.max_msgs_per_subject
        or bool(current.discard_new_per_subject) != config.discard_new_per_subject
    ):
        with _storage_refusal(cfg):
            info = await js.update_stream(config)
        log.info(
            "stream_updated",
            stream=cfg.name,
            max_age_s=cfg.max_age_s,
            max_bytes=cfg.max_bytes,
            discard=cfg.discard,
            max_msgs_per_subject=cfg.max_msgs_per_subject,
            replicas=cfg.replicas,
        )
    return info


STORAGE_REFUSALS = frozenset({10023, 10047})
"""JetStream's "insufficient resources" and "insufficient storage resources available"; a cluster says
"no suitable peers for placement" (10005) with "insufficient storage" in the description."""


@contextlib.contextmanager
def _storage_refusal(cfg: StreamConfig) -> Iterator[None]:
    """Turn the broker's refusal of the stream for want of storage into a :class:`ConfigError` naming
    ``stream.max_bytes``: it will not find the room by being asked again. Other errors pass as they are.

    Raises:
        ConfigError: the broker has less storage to reserve than ``cfg.max_bytes``.
    """
    try:
        yield
    except APIError as exc:
        description = str(exc.description or "")
        if exc.err_code in STORAGE_REFUSALS or (exc.err_code == 10005 and "storage" in description):
            limit = "no limit" if cfg.max_bytes == -1 else f"{cfg.max_bytes / 2**30:g} GiB"
            raise ConfigError(
                f"the NATS server has no room for the stream {cfg.name} ({description}, err_code {exc.err_code}): "
                f"it reserves the stream's max_bytes ({limit}) on each node that holds it, out of about 75 % of "
                "the free disk under its store directory (the daemon's data dir for the bundled one). Free disk "
                "space there, or set a smaller stream.max_bytes (VIGIL_STREAM_MAX_BYTES)",
                key="stream.max_bytes",
            ) from exc
        raise


async def restore_stream(
    js: JetStreamContext, cfg: StreamConfig, subjects: Sequence[str] = DEFAULT_SUBJECTS.stream_subjects
) -> api.StreamInfo:
    """The stream's info; a stream that is gone is created again at once, with an error in the log.

    Gone while the daemon runs means someone deleted it, or the broker lost its store. Agents may
    not create streams (``vigil up --auth``), so until the daemon does they could not publish; what
    the old stream held past the committed offset is recorded by the ingest (``stream_recreated``).
    """
    try:
        return await js.stream_info(cfg.name)
    except NotFoundError:
        log.error(
            "stream_missing",
            stream=cfg.name,
            note="the stream was deleted (by someone else?) or the broker lost its store; creating it again",
        )
        return await ensure_stream(js, cfg, subjects)


async def bind_consumer(js: JetStreamContext, cfg: StreamConfig, start_seq: int) -> api.ConsumerInfo:
    """(Re)create the durable pull consumer so that it delivers from ``start_seq`` on, in stream order.

    The DuckDB offset is the truth: the consumer is recreated from it on every start, and from
    the ingest's ``next_seq`` on every rewind, so messages fetched but never committed come
    again, in order, before anything newer (a consumer left as it was would only redeliver
    them after ``ack_wait``, behind newer messages). Acks are flow control only (the offset is
    the durability), so the policy is ``all``: one ack after each commit covers its batch.
    """
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(cfg.name, cfg.consumer)
    config = api.ConsumerConfig(
        durable_name=cfg.consumer,
        ack_policy=api.AckPolicy.ALL,
        ack_wait=cfg.ack_wait_s,
        max_ack_pending=100_000,
        max_waiting=16,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if start_seq > 1 else api.DeliverPolicy.ALL,
        opt_start_seq=start_seq if start_seq > 1 else None,
        # One replica even on a replicated stream: the consumer holds nothing the offset does not, and
        # an R3 consumer takes a RAFT election each time it is recreated (seconds; on a busy node longer
        # than a JetStream API request waits), so rewinds after a node died timed out again and again.
        # An R1 consumer is created at once; if its node dies, the pull fails and it is recreated
        # from the offset on a live node.
        num_replicas=1,
    )
    info = await js.add_consumer(cfg.name, config)
    log.info("consumer_bound", consumer=cfg.consumer, start_seq=start_seq)
    return info


async def stream_view(js: JetStreamContext, stream: str, next_seq: int) -> tuple[api.StreamInfo, int | None]:
    """The stream's info, and the lowest sequence >= ``next_seq`` it still holds (None: none).

    One message lookup: used on gaps only.
    """
    info = await js.stream_info(stream)
    existing: int | None = None
    if next_seq <= info.state.last_seq:
        try:
            # The lowest sequence >= next_seq on any subject (the whole message comes back: rare path).
            existing = (await js.get_msg(stream, next_seq, subject=">", next=True)).seq
        except NotFoundError:
            existing = None
    return info, existing


@dataclass(slots=True)
class Pulled:
    """One pull request's messages and the status that ended it ("" when the batch filled or the wait ran out)."""

    msgs: list[Msg] = field(default_factory=list)
    status: str = ""
    description: str = ""

    @property
    def consumer_gone(self) -> bool:
        """The consumer (or its stream) no longer exists: bind it again."""
        return self.status == "503" or (self.status == "409" and "deleted" in self.description.lower())

    @property
    def refused(self) -> bool:
        """The request itself was refused (a status other than the ones that end a pull)."""
        return self.status not in ("", "404", "408", "409") and not self.consumer_gone

    @property
    def too_big(self) -> bool:
        """The next message does not fit the byte budget at all."""
        return self.status == "409" and "maxbytes" in self.description.lower() and not self.msgs


class Puller:
    """Pull requests with a byte budget on one incarnation of the durable consumer.

    nats-py's ``fetch`` bounds a request by count only: 256 messages of 0.5 MB overflow the
    server's buffer for the connection (``max_pending``, 64 MiB by default), the server drops
    them as a slow consumer, and they stay ack-pending until ``ack_wait``. Here every request
    carries ``max_bytes``, and ``no_wait`` with ``expires``: the server answers as soon as
    something is there (at most ``expires`` later), delivers at most ``batch`` messages and
    ``max_bytes`` bytes, and ends with a full batch or a status, so one request's messages do
    not spill into the next. Anything that still arrives late is kept and handed out first by
    the next :meth:`pull`; the ingest's ``Sequencer`` puts order on it.
    """

    def __init__(
        self, js: JetStreamContext, cfg: StreamConfig, *, batch: int, max_bytes: int, expires_s: float
    ) -> None:
        # nats-py keeps the connection and the API prefix private; a pull needs both.
        self._nc = js._nc
        self._subject = f"{js._prefix}.CONSUMER.MSG.NEXT.{cfg.name}.{cfg.consumer}"
        self._inbox = self._nc.new_inbox()
        self.batch = batch
        # One message must always fit, or the consumer would answer every request with a 409.
        self.max_bytes = max(max_bytes, self._nc.max_payload + 4096)
        self.expires_s = expires_s
        self._sub: Subscription | None = None
        self._buffer: list[Msg] = []
        self._want = 0
        self._status = ("", "")
        self._done = anyio.Event()

    async def open(self) -> None:
        self._sub = await self._nc.subscribe(self._inbox, cb=self._on_msg)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):  # closed connection, bad subscription: nothing to undo
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        if headers and (status := headers.get(api.Header.STATUS.value)):
            if status != "100":  # idle heartbeats (not asked for) end nothing
                self._status = (status, str(headers.get(api.Header.DESCRIPTION, "")))
                self._done.set()
            return
        self._buffer.append(msg)
        self._want -= 1
        if self._want <= 0:
            self._done.set()

    async def pull(self) -> Pulled:
        """The next messages: those that arrived late, else one request's worth.

        Raises:
            nats.errors.Error: the request could not be sent (connection closed).
        """
        if not self._buffer:
            self._want = self.batch
            self._status = ("", "")
            self._done = anyio.Event()
            request = {
                "batch": self.batch,
                "max_bytes": self.max_bytes,
                "expires": int(self.expires_s * 1e9),
                "no_wait": True,
            }
            await self._nc.publish(self._subject, json.dumps(request).encode(), reply=self._inbox)
            # The server ends the request by itself; the margin covers a broker that went away
            # (a restarted broker forgot the request: ask again soon).
            with anyio.move_on_after(self.expires_s + 0.5):
                await self._done.wait()
        pulled = Pulled(self._buffer, *self._status)
        self._buffer, self._status = [], ("", "")
        return pulled
