"""JetStream publishes acknowledged in one reply inbox of our own: how the agent and ``vigil push`` publish.

A JetStream publish is a core NATS publish with a reply subject; the stream's answer (its ack, or
why it refused) comes back there. nats-py's ``publish_async`` does this with machinery an agent pays
for at every flush, on the training's cores: a task to take its pending-count semaphore per message,
a token of a fresh NUID and random bytes (a syscall), and each ack decoded from JSON into a dict and
then a dataclass by reflection. Here a counter names the reply, the publish round bounds what is in
flight, and the ack is decoded with msgspec into the three fields that matter; one subscription
collects them (nats-py renews it after a reconnect), ``<inbox>.*`` under this connection's own inbox
prefix (``_INBOX.<user>.<connection>``, see :mod:`trainvigil.schemas.credentials`), never the user's
``_INBOX.<user>.>``: an agent handles its own acks only. A round (:func:`publish_round`) sends up to
``max_inflight`` messages pipelined and waits for their acks: the agent's live publishing and the upload of
sealed files (:mod:`trainvigil.agents.spill.push`) alike.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

    from ..spill.outbox import OutMsg

NO_RESPONDERS = "503"
"""The status of the reply the server sends when no stream takes the subject."""


class StreamError(msgspec.Struct):
    """Why the stream refused a message, as JetStream's ack says it."""

    code: int = 0
    err_code: int = 0
    description: str = ""


class PubAck(msgspec.Struct):
    """JetStream's answer to a publish: the stream and sequence that stored it, or an ``error``."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    """The stream had this ``Nats-Msg-Id`` already (within its duplicate window) and kept the first."""
    error: StreamError | None = None


_decode = msgspec.json.Decoder(PubAck).decode


class NoStreamError(ConnectionError):
    """No JetStream stream takes the subject (the daemon has not created it, or it was deleted)."""


class StreamRefusedError(Exception):
    """The stream refused the message (full with ``discard: new``, a message too large, ...)."""

    def __init__(self, error: StreamError) -> None:
        super().__init__(f"{error.description} (code {error.code}, err_code {error.err_code})")
        self.code, self.err_code, self.description = error.code, error.err_code, error.description


class AckInbox:
    """Publishes to JetStream on a connection and hands back each publish's ack as a future.

    Start it (:meth:`open`) once per connection, before publishing.
    """

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._prefix = nc.new_inbox() + "."
        self._pending: dict[str, tuple[asyncio.Future[PubAck], str]] = {}
        """Reply token -> the ack's future and the subject published to."""
        self._count = 0
        self._sub: Subscription | None = None

    async def open(self) -> AckInbox:
        self._sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_reply)
        return self

    async def close(self) -> None:
        """Unsubscribe, and cancel the acks still awaited."""
        for future, _ in list(self._pending.values()):
            future.cancel()
        if self._sub is not None:
            with contextlib.suppress(Exception):  # a closed connection: nothing to undo
                await self._sub.unsubscribe()
            self._sub = None

    async def publish_async(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[PubAck]:
        """Send one message; the future resolves to its :class:`PubAck`, or fails with why it was not stored.

        Raises:
            nats.errors.Error: the message could not be sent (the connection is closed).
        """
        self._count += 1
        token = str(self._count)
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._pending[token] = (future, subject)
        future.add_done_callback(lambda _: self._pending.pop(token, None))
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
        except BaseException:
            future.cancel()
            raise
        return future

    async def _on_reply(self, msg: Msg) -> None:
        future, subject = self._pending.get(msg.subject[len(self._prefix) :], (None, ""))
        if future is None or future.done():  # given up on already (timed out, cancelled)
            return
        headers: Any = msg.headers
        if headers and headers.get("Status") == NO_RESPONDERS:
            future.set_exception(NoStreamError(f"no JetStream stream takes {subject} (the daemon creates it)"))
            return
        try:
            ack = _decode(msg.data)
        except msgspec.DecodeError as exc:
            future.set_exception(exc)
            return
        if ack.error is not None:
            future.set_exception(StreamRefusedError(ack.error))
        else:
            future.set_result(ack)


class JetStream(Protocol):
    """What a publish round sends through: :class:`AckInbox` (a test's fake, without a broker)."""

    async def publish_async(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[Any]: ...


async def publish_round(
    js: JetStream, msgs: Sequence[OutMsg], timeout: float, pace: Callable[[], None] = lambda: None
) -> tuple[int, BaseException | None]:
    """Publish ``msgs`` pipelined, each with its ``Nats-Msg-Id``, calling ``pace()`` between two
    (the agent's worker gives the GIL back there), and wait up to ``timeout`` seconds for their acks.
    Not after the last: the wait for the acks gives the GIL back anyway, and a pause just before it
    would cost a second hand-over of the GIL (the training thread's, then the worker's 5 ms wait).

    Returns how many from the front were acknowledged, and the first error (``None`` if all were).
    """
    futures: list[asyncio.Future[Any]] = []
    error: BaseException | None = None
    try:
        for i, m in enumerate(msgs):
            if i:
                pace()
            futures.append(await js.publish_async(m.subject, m.payload, headers={"Nats-Msg-Id": m.msg_id}))
    except asyncio.CancelledError:
        for future in futures:
            future.cancel()
        raise
    except Exception as exc:
        error = exc
    late: set[asyncio.Future[Any]] = set()
    if futures:
        # One waiter for the round (no task per ack): it wakes when every ack is in, at the first
        # failure, or at the timeout; an ack still missing then is given up on.
        try:
            _, late = await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for future in futures:
                future.cancel()  # no-op for those done
    acked = 0
    for future in futures:
        if future in late:
            return acked, TimeoutError(f"no acknowledgement within {timeout:g} s")
        if future.cancelled():
            return acked, ConnectionError("the connection closed before the acknowledgement came")
        if (failed := future.exception()) is not None:
            return acked, failed
        acked += 1
    return acked, error
