"""The daemon's answering side of the bus: where it answers, how often one asker is answered, whose acks an agent reads.

Real daemons with the generated ``--auth`` nats-server configuration; every request goes through the
server with a role's credentials, as an attacker on the same host would send it. What the daemon
publishes is watched with the daemon's own credentials (the only role that may read every subject).
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from support import AuthBroker, SecuredDaemon, ShardDaemon, secured_shard, vigil, wait_for

from trainvigil.agents.options import AgentOptions
from trainvigil.agents.spill.outbox import OutMsg
from trainvigil.agents.transport.publisher import NatsPublisher
from trainvigil.daemon.broker.ratelimit import Buckets, Tally
from trainvigil.daemon.broker.replies import asker_of, inbox_prefixes
from trainvigil.daemon.config import StreamConfig
from trainvigil.schemas import DEFAULT_SUBJECTS, Envelope, Heartbeat, Source, encode
from trainvigil.schemas.credentials import BusAccess
from trainvigil.schemas.query import QueryRequest, QueryResult

STREAM = StreamConfig()
WATCHED = ["vigil.v1.*.victim.metrics"]
"""Where a sharded broker's mappings put an answer published on ``vigil.v1.victim.metrics``."""
FORBIDDEN_REPLIES = [
    "vigil.v1.victim.metrics",  # into the stream: stored for good, a dead letter of the victim's run
    "vigil.v1.alerts.victim",  # a forged alert for whoever follows the run
    "vigil.v1.ctl.canary",  # a control request in the daemon's name
    f"$JS.API.STREAM.INFO.{STREAM.name}",  # the JetStream API, with the daemon's rights
    f"$JS.API.STREAM.PURGE.{STREAM.name}",
    "$SYS.REQ.SERVER.PING",
    "_INBOX.agent.someone.1",  # an agent's inbox: agents never ask
    "_INBOX.reader.*",  # not one inbox
    "_INBOX.reader",
]


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredDaemon]:
    daemon = SecuredDaemon(tmp_path_factory.mktemp("answers") / "data")
    daemon.start()
    yield daemon
    daemon.terminate()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AuthBroker, ShardDaemon]]:
    """A broker with users and the mappings of one shard (``vigil auth DIR --shards 1``), and that shard."""
    with secured_shard(tmp_path_factory.mktemp("answers-sharded")) as both:
        yield both


async def _connected(url: str, creds: Path) -> NATS:
    nc = NATS()
    await nc.connect(url, allow_reconnect=False, **BusAccess(creds=str(creds)).connect_options())
    return nc


def _watching(url: str, daemon_creds: Path, subjects: list[str], body: Callable[[], Awaitable[Any]]) -> list[Msg]:
    """What reaches ``subjects`` while ``body`` runs, watched as the daemon's user (allowed to read anything)."""

    async def watch() -> list[Msg]:
        seen: list[Msg] = []

        async def keep(msg: Msg) -> None:
            seen.append(msg)

        spy = await _connected(url, daemon_creds)
        try:
            for subject in subjects:
                await spy.subscribe(subject, cb=keep)
            await spy.flush()
            await body()
            await spy.flush()
        finally:
            await spy.close()
        return seen

    return asyncio.run(watch())


async def _ask_with_replies(url: str, creds: Path, subject: str, payload: bytes, replies: list[str]) -> Msg:
    """Send ``payload`` to ``subject`` once per reply subject in ``replies``, then once with a real inbox, and
    return the answer to the last: the daemon took the ones before by then (one subscription, in order)."""
    nc = await _connected(url, creds)
    try:
        for reply in replies:
            await nc.publish(subject, payload, reply=reply)
        return await nc.request(subject, payload, timeout=20)
    finally:
        await nc.close()


def _metric(daemon: SecuredDaemon | ShardDaemon, line_start: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.http_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(line_start)]
    return sum(values)


def _log_lines(daemon: SecuredDaemon) -> int:
    return len(daemon.log.read_text().splitlines())


def test_a_reader_naming_a_stream_alert_control_or_api_subject_as_its_reply_gets_nothing_published_there(
    bus: SecuredDaemon,
) -> None:
    before = _metric(bus, 'vigil_replies_refused_total{responder="sql"}')
    answer: list[Msg] = []

    async def attack() -> None:
        sql = msgspec.msgpack.encode(QueryRequest(sql="select repeat('x', 100000) as big"))
        answer.append(
            await _ask_with_replies(bus.nats_url, bus.creds("reader"), DEFAULT_SUBJECTS.query, sql, FORBIDDEN_REPLIES)
        )

    seen = _watching(bus.nats_url, bus.creds("daemon"), [s for s in FORBIDDEN_REPLIES if "*" not in s], attack)
    assert [m.subject for m in seen] == []
    result = msgspec.msgpack.decode(answer[0].data, type=QueryResult)
    assert not result.error and len(result.rows[0][0]) == 100_000, "the reader's own inbox is answered"
    refused = _metric(bus, 'vigil_replies_refused_total{responder="sql"}') - before
    assert refused == len(FORBIDDEN_REPLIES)
    assert bus.scalar("select count(*) from dead_letters where subject like 'vigil.v1.victim.%'") == 0
    lines = [line for line in bus.log.read_text().splitlines() if '"event": "reply_refused"' in line]
    assert 1 <= len(lines) <= 3, lines  # one counted line a second at most, not one a request


def test_a_canary_trigger_naming_an_alert_subject_as_its_reply_gets_nothing_published_there(bus: SecuredDaemon) -> None:
    """Only the daemon's user may trigger canaries; even its requests are answered in an inbox only."""
    replies = ["vigil.v1.alerts.victim", "vigil.v1.victim.run"]
    answer: list[Msg] = []

    async def attack() -> None:
        answer.append(await _ask_with_replies(bus.nats_url, bus.creds("daemon"), DEFAULT_SUBJECTS.canary, b"", replies))

    assert _watching(bus.nats_url, bus.creds("daemon"), replies, attack) == []
    assert answer[0].data, "a trigger from an inbox is answered"
    assert _metric(bus, 'vigil_replies_refused_total{responder="canary"}') >= len(replies)


def test_a_shard_answers_its_roll_call_and_queries_in_inboxes_only(sharded: tuple[AuthBroker, ShardDaemon]) -> None:
    broker, daemon = sharded
    answers: list[Msg] = []
    sql = msgspec.msgpack.encode(QueryRequest(sql="select 1"))

    async def attack() -> None:
        for subject, payload in [(DEFAULT_SUBJECTS.roll_call, b""), (daemon.shard.query_subject, sql)]:
            replies = [s for s in FORBIDDEN_REPLIES if "*" not in s]
            answers.append(await _ask_with_replies(broker.url, broker.creds("reader"), subject, payload, replies))

    watched = [s for s in FORBIDDEN_REPLIES if "*" not in s] + WATCHED
    seen = _watching(broker.url, broker.creds("daemon"), watched, attack)
    assert [m.subject for m in seen] == []
    assert msgspec.msgpack.decode(answers[0].data) == [0, 1]
    assert msgspec.msgpack.decode(answers[1].data, type=QueryResult).rows == [[1]]
    assert _metric(daemon, 'vigil_replies_refused_total{responder="roll_call"}') >= 1
    assert _metric(daemon, 'vigil_replies_refused_total{responder="sql"}') >= 1


FLOOD = 4000


def test_one_readers_flood_is_answered_busy_and_a_second_readers_query_still_succeeds(bus: SecuredDaemon) -> None:
    lines_before = _log_lines(bus)
    answers: list[QueryResult] = []

    async def flood() -> None:
        nc = await _connected(bus.nats_url, bus.creds("reader"))
        try:
            inbox = nc.new_inbox()

            async def keep(msg: Msg) -> None:
                answers.append(msgspec.msgpack.decode(msg.data, type=QueryResult))

            await nc.subscribe(inbox, cb=keep)
            request = msgspec.msgpack.encode(QueryRequest(sql="select count(*) from steps"))
            for _ in range(FLOOD):
                await nc.publish(DEFAULT_SUBJECTS.query, request, reply=inbox)
            await nc.flush()
            # The second reader asks while the daemon still works through the flood.
            second = await asyncio.to_thread(
                vigil, "sql", "select 42 as answer", "--nats", bus.nats_url, "--creds", str(bus.creds("reader")),
                "--format", "csv", timeout=120,
            )  # fmt: skip
            assert second.returncode == 0, second.stderr
            assert second.stdout.splitlines()[-1] == "42"
            await asyncio.to_thread(wait_for, lambda: len(answers) >= FLOOD, 60, "an answer to every request")
        finally:
            await nc.close()

    asyncio.run(flood())
    limited = [r for r in answers if r.busy and "query_rate_per_s" in r.error]
    assert len(limited) >= FLOOD // 2, "the flood is answered busy, past its asker's rate"
    assert bus.scalar("select 7") == 7  # healthy, and answering
    with urllib.request.urlopen(f"http://127.0.0.1:{bus.http_port}/healthz", timeout=10) as response:
        assert response.status == 200
    grown = _log_lines(bus) - lines_before
    # A line per query answered (the second reader's too), refusals a counted line a second at most.
    assert grown <= len(answers) - len(limited) + 60, f"{grown} log lines for {FLOOD} requests"
    assert _metric(bus, 'vigil_queries_total{outcome="limited"}') >= len(limited)


def _heartbeat(run_id: str, seq: int) -> OutMsg:
    envelope = Envelope(source=Source(run_id=run_id, host="h", pid=1), seq=seq, records=[Heartbeat(time=1.0)])
    return OutMsg(DEFAULT_SUBJECTS.data(run_id, "hb"), f"{run_id}/0/h/1/n/{seq}", encode(envelope), 1)


def test_each_agent_reads_its_acks_in_an_inbox_of_its_own_connection_and_never_another_agents(
    bus: SecuredDaemon,
) -> None:
    """The agent's role may read ``_INBOX.agent.>`` (one user for every agent): what matters is that the agent
    code subscribes to its own connection's inbox only, so no agent ever handles another's acks."""

    async def two_agents() -> tuple[list[str], list[str], list[int], list[tuple[int, BaseException | None]]]:
        opts = AgentOptions(run_id="inboxes", nats_url=bus.nats_url, nats_creds=str(bus.creds("agent")))
        agents = [NatsPublisher(opts, f"agent-{i}", lambda: None, lambda _: None) for i in range(2)]
        tasks = [asyncio.create_task(a.run(lambda: None)) for a in agents]
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while not all(a.connected for a in agents):
                assert loop.time() < deadline, "the agents did not connect"
                await asyncio.sleep(0.05)
            rounds = [
                await a.publish([_heartbeat(f"inbox-{i}", s) for s in range(1, 6)], 10) for i, a in enumerate(agents)
            ]
            inboxes = [a._inbox for a in agents]
            assert all(inbox is not None and inbox._sub is not None for inbox in inboxes)
            subs = [inbox._sub for inbox in inboxes if inbox is not None and inbox._sub is not None]
            fresh = [inbox._nc.new_inbox() for inbox in inboxes if inbox is not None]
            return [s.subject for s in subs], fresh, [s.delivered for s in subs], rounds
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    subjects, fresh, delivered, rounds = asyncio.run(two_agents())
    assert rounds == [(5, None), (5, None)]
    assert delivered == [5, 5], "each agent's inbox got its own 5 acks and nothing else"
    own = [".".join(s.split(".")[:3]) for s in subjects]  # _INBOX.agent.<this connection>
    assert own[0] != own[1] and all(o.startswith("_INBOX.agent.") and len(o) > len("_INBOX.agent.") for o in own)
    assert all(f.startswith(o + ".") for f, o in zip(fresh, own, strict=True)), (
        "every inbox of a connection is under its own prefix"
    )
    assert all(s.endswith(".*") and not s.startswith(("_INBOX.agent.>", "_INBOX.agent.*")) for s in subjects)


# ---- the pure parts: which reply subjects, which asker, how many a second ---------------------------------


class Clock:
    """A hand-wound clock for :class:`Buckets` and :class:`Tally`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("reply", "secured", "asker"),
    [
        ("_INBOX.reader.0123456789abcdef.XYZ", True, "_INBOX.reader.0123456789ab"),
        ("_INBOX.reader.0123456789abcdef.XYZ.7", True, "_INBOX.reader.0123456789ab"),
        ("_INBOX.daemon.a1b2c3d4e5f6.NUID", True, "_INBOX.daemon.a1b2c3d4e5f6"),
        ("_INBOX.agent.a1b2c3d4e5f6.NUID", True, None),
        ("_INBOX.agent-vision.a1b2c3d4e5f6.NUID", True, None),
        ("_INBOX.readers.x", True, None),
        ("_INBOX.reader.>", True, None),
        ("_INBOX.reader..x", True, None),
        ("_INBOX.reader.", True, None),
        ("_INBOX.Ab3dEf6hIj9lMnOpQrStUv", False, "_INBOX.Ab3dEf6hIj9l"),
        ("_INBOX.Ab3dEf6hIj9lMnOpQrStUv.42", False, "_INBOX.Ab3dEf6hIj9l"),
        ("vigil.v1.victim.metrics", False, None),
        ("$JS.API.STREAM.PURGE.VIGIL", False, None),
        ("_INBOX." + "x" * 300, False, None),
    ],
)
def test_only_an_askers_inbox_is_answered_and_its_connection_names_the_asker(
    reply: str, secured: bool, asker: str | None
) -> None:
    assert asker_of(reply, inbox_prefixes(secured)) == asker


def test_a_connections_inboxes_from_nats_py_name_one_asker_and_another_connections_another() -> None:
    async def inboxes() -> list[list[str]]:
        made = []
        for _ in range(2):
            nc = NATS()  # no credentials: nats-py's own _INBOX.<NUID>
            made.append([nc.new_inbox() for _ in range(3)])
        return made

    first, second = asyncio.run(inboxes())
    prefixes = inbox_prefixes(False)
    assert len({asker_of(i, prefixes) for i in first}) == 1
    assert {asker_of(i, prefixes) for i in first}.isdisjoint({asker_of(i, prefixes) for i in second})


def test_a_bucket_allows_its_burst_then_its_rate_and_forgets_askers_gone_quiet() -> None:
    clock = Clock()
    buckets = Buckets(rate=10.0, burst=5, most=100, clock=clock)
    assert [buckets.take("a") for _ in range(6)] == [True] * 5 + [False]
    assert buckets.take("b"), "another asker has a bucket of its own"
    clock.now = 0.1
    assert buckets.take("a") and not buckets.take("a")  # one token a tenth of a second
    clock.now = 10.0
    assert buckets.take("c") and len(buckets) == 1, "a bucket full again is forgotten"


def test_past_the_most_askers_new_ones_share_one_bucket_and_memory_stays_bounded() -> None:
    clock = Clock()
    buckets = Buckets(rate=1.0, burst=2, most=3, clock=clock)
    for asker in ("a", "b", "c"):
        assert buckets.take(asker)
    made_up = [buckets.take(f"fake-{i}") for i in range(1000)]
    assert made_up[:2] == [True, True] and not any(made_up[2:]), "the made-up askers share one bucket"
    assert len(buckets) <= 4
    assert buckets.take("a"), "an asker tracked before keeps its own bucket"


class Lines:
    """A logger that keeps what it was asked to say."""

    def __init__(self) -> None:
        self.said: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.said.append((event, fields))


def test_a_tally_says_a_flood_in_one_counted_line_a_second() -> None:
    clock, lines = Clock(), Lines()
    tally = Tally(lines, "refused", clock=clock)
    for i in range(1000):
        clock.now = i / 500  # 1 000 events over 2 s
        tally.add(n=i)
    assert [fields["count"] for _, fields in lines.said] == [1, 500], "the first at once, then one line a second"
    clock.now = 5.0
    tally.add(n=1000)
    assert [fields["count"] for _, fields in lines.said] == [1, 500, 500], "the rest is said with the next one"
    assert lines.said[-1][1]["n"] == 1000
