"""The agent's JetStream publishing (``agents/transport/acks.py``: ``AckInbox``, ``publish_round``) against a real
nats-server: acks in order, a refusal and a missing stream named, a silent broker timed out, nothing left waiting."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import pytest
from support import NatsServer

from trainvigil.agents.spill.outbox import OutMsg
from trainvigil.agents.transport.acks import AckInbox, NoStreamError, PubAck, StreamRefusedError, publish_round

SUBJECT = "acks.test"


def _msgs(n: int, prefix: str = "m") -> list[OutMsg]:
    return [OutMsg(SUBJECT, f"{prefix}/{i}", f"payload {i}".encode(), 1) for i in range(n)]


def _with_inbox(url: str, body: Callable[[Any, AckInbox], Awaitable[Any]], **stream: Any) -> Any:
    """Run ``body(js, inbox)`` on a fresh connection, with stream ``ACKS`` on ``acks.>`` made from ``stream`` unless
    ``stream`` is ``{"none": True}``."""

    async def main() -> Any:
        nc = await nats.connect(url, connect_timeout=2)
        try:
            js = nc.jetstream()
            if not stream.pop("none", False):
                await js.add_stream(name="ACKS", subjects=["acks.>"], **stream)
            inbox = await AckInbox(nc).open()
            try:
                return await body(js, inbox)
            finally:
                await inbox.close()
        finally:
            await nc.close()

    return asyncio.run(main())


def test_a_round_is_acknowledged_in_order_each_message_stored_once_by_its_id(nats_server: NatsServer) -> None:
    async def body(js: Any, inbox: AckInbox) -> tuple[Any, ...]:
        first = await publish_round(inbox, _msgs(5), timeout=5)
        again = await publish_round(inbox, _msgs(5), timeout=5)  # the same ids: JetStream keeps the first
        acks = [await (await inbox.publish_async(SUBJECT, b"x", {"Nats-Msg-Id": "m/0"}))]
        info = await js.stream_info("ACKS")
        return first, again, acks, info.state.messages, len(inbox._pending)

    first, again, acks, stored, pending = _with_inbox(nats_server.url, body)
    assert first == (5, None) and again == (5, None)
    assert isinstance(acks[0], PubAck) and acks[0].duplicate and acks[0].stream == "ACKS" and acks[0].seq == 1
    assert stored == 5
    assert pending == 0, "every ack's future is let go once resolved"


def test_a_full_stream_refuses_and_the_round_counts_what_was_stored_before(nats_server: NatsServer) -> None:
    from nats.js.api import DiscardPolicy

    async def body(js: Any, inbox: AckInbox) -> tuple[int, BaseException | None]:
        return await publish_round(inbox, _msgs(5), timeout=5)

    acked, error = _with_inbox(nats_server.url, body, max_msgs=3, discard=DiscardPolicy.NEW)
    assert acked == 3
    assert isinstance(error, StreamRefusedError) and error.err_code == 10077, error
    assert "maximum messages" in str(error)


def test_no_stream_for_the_subject_is_named_at_once(nats_server: NatsServer) -> None:
    async def body(js: Any, inbox: AckInbox) -> tuple[tuple[int, BaseException | None], float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await publish_round(inbox, _msgs(3), timeout=10)
        return result, loop.time() - started

    (acked, error), took = _with_inbox(nats_server.url, body, none=True)
    assert acked == 0 and isinstance(error, NoStreamError) and SUBJECT in str(error)
    assert took < 5, "the broker says so at once: the round does not wait out its timeout"


def test_a_broker_that_never_acknowledges_times_the_round_out_and_leaves_nothing_waiting(
    nats_server: NatsServer,
) -> None:
    async def body(js: Any, inbox: AckInbox) -> tuple[tuple[int, BaseException | None], int]:
        # A core subscriber takes the subject instead of a stream: the messages go out, no ack comes back.
        sub = await js._nc.subscribe(SUBJECT)
        result = await publish_round(inbox, _msgs(3), timeout=0.3)
        await sub.unsubscribe()
        await asyncio.sleep(0)  # the given-up futures' done callbacks run at the loop's next turn
        return result, len(inbox._pending)

    (acked, error), pending = _with_inbox(nats_server.url, body, none=True)
    assert acked == 0 and isinstance(error, TimeoutError) and "0.3 s" in str(error)
    assert pending == 0


def test_closing_the_inbox_ends_a_round_still_waiting(nats_server: NatsServer) -> None:
    async def body(js: Any, inbox: AckInbox) -> tuple[int, BaseException | None]:
        sub = await js._nc.subscribe(SUBJECT)  # nothing acknowledges
        asyncio.get_running_loop().call_later(0.2, lambda: asyncio.ensure_future(inbox.close()))
        try:
            return await asyncio.wait_for(publish_round(inbox, _msgs(2), timeout=30), 10)
        finally:
            await sub.unsubscribe()

    acked, error = _with_inbox(nats_server.url, body, none=True)
    assert acked == 0 and isinstance(error, ConnectionError) and "closed" in str(error)


@pytest.mark.parametrize("fail_at", [0, 2])
def test_a_publish_that_cannot_be_sent_stops_the_round_there(nats_server: NatsServer, fail_at: int) -> None:
    """A connection that fails mid-round: what was sent before is still acknowledged and counted."""

    async def body(js: Any, inbox: AckInbox) -> tuple[int, BaseException | None]:
        real = inbox.publish_async
        calls = 0

        async def flaky(subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[PubAck]:
            nonlocal calls
            calls += 1
            if calls > fail_at:
                raise ConnectionError("connection closed")
            return await real(subject, payload, headers)

        inbox.publish_async = flaky  # type: ignore[method-assign]
        return await publish_round(inbox, _msgs(4), timeout=5)

    acked, error = _with_inbox(nats_server.url, body)
    assert acked == fail_at and isinstance(error, ConnectionError)


def test_a_round_gives_the_gil_back_between_messages_not_after_the_last(nats_server: NatsServer) -> None:
    """After the last message the round waits for its acks, which gives the GIL back anyway."""

    async def body(js: Any, inbox: AckInbox) -> tuple[tuple[int, BaseException | None], list[int]]:
        sent_at_pause: list[int] = []
        result = await publish_round(inbox, _msgs(5), timeout=5, pace=lambda: sent_at_pause.append(inbox._count))
        return result, sent_at_pause

    result, sent_at_pause = _with_inbox(nats_server.url, body)
    assert result == (5, None)
    assert sent_at_pause == [1, 2, 3, 4]
