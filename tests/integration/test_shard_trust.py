"""What a reply on the bus may do on the operator's machine: never run SQL, only carry data.

``vigil sql``/``runs``/``export`` load the answers of shards (and a daemon's page for Parquet) into a
local DuckDB. A process that is no daemon can answer on an open bus; here one does, with a column
"type" that would close the statement and copy a private file, against the real CLI.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import threading
from pathlib import Path

import duckdb
import msgspec
import pytest
import support
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from trainvigil.daemon.cli.shardsql import Gathered, merge, open_bus
from trainvigil.daemon.cli.sqlclient import QuerySource
from trainvigil.daemon.sandbox import sandboxed
from trainvigil.daemon.shards import ShardPlan, plan
from trainvigil.daemon.shards.planner import _Planner
from trainvigil.daemon.store.query import run_query
from trainvigil.errors import QueryError, QueryRefusedError
from trainvigil.schemas import DEFAULT_SUBJECTS
from trainvigil.schemas.credentials import ANONYMOUS, BusAccess
from trainvigil.schemas.query import QueryResult
from trainvigil.schemas.shards import ShardId
from trainvigil.schemas.sqltypes import (
    Array,
    ColumnTypeError,
    Decimal,
    Map,
    Scalar,
    Struct,
    parse_type,
    quote_identifier,
    render,
)

READY_S = 10.0


class Rogue:
    """A connection that is no daemon answering queries: as shard 0/1 (the roll call and that shard's
    subject) or as the daemon itself (the query subject), always with ``answer``.

    It runs its own event loop in a thread, so the CLI under test is a separate process that meets it
    on the broker. ``violations`` holds the broker's refusals of what it tried (with credentials)."""

    def __init__(self, url: str, answer: QueryResult, *, as_daemon: bool = False, access: BusAccess = ANONYMOUS):
        self.url = url
        self.answer = answer
        self.as_daemon = as_daemon
        self.access = access
        self.asked: list[str] = []
        self.violations: list[str] = []
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rogue-responder", daemon=True)

    def __enter__(self) -> Rogue:
        self._thread.start()
        assert self._ready.wait(READY_S), "the rogue responder did not connect"
        if self._failed is not None:
            raise self._failed
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(READY_S)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by __enter__
            self._failed = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()

        async def keep(exc: Exception) -> None:
            if "violation" in str(exc).lower():
                self.violations.append(str(exc))

        nc = NATS()
        await nc.connect(self.url, allow_reconnect=False, error_cb=keep, **self.access.connect_options())
        reply = msgspec.msgpack.encode(self.answer)

        async def roll_call(msg: Msg) -> None:
            self.asked.append(msg.subject)
            if msg.reply:
                await nc.publish(msg.reply, msgspec.msgpack.encode([0, 1]))

        async def query(msg: Msg) -> None:
            self.asked.append(msg.subject)
            if msg.reply:
                await nc.publish(msg.reply, reply)

        if self.as_daemon:
            await nc.subscribe(DEFAULT_SUBJECTS.query, cb=query)
        else:
            await nc.subscribe(DEFAULT_SUBJECTS.roll_call, cb=roll_call)
            await nc.subscribe(ShardId(0, 1).query_subject, cb=query)
        # Two round trips: nats-py sends a flush's PING ahead of what is still queued, and the server
        # says a subscription was refused before the PONG that follows it.
        await nc.flush()
        await nc.flush()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await nc.close()


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "operator-secret"
    secret.write_text("the operator's private token\n")
    secret.chmod(0o600)
    return secret


def _closes_the_cast(secret: Path, out: Path) -> str:
    """A "type" that ends ``CAST(c0 AS ...`` and the statement, then copies ``secret`` to ``out``."""
    return (
        f"VARCHAR) AS a FROM wire; COPY (SELECT content FROM read_text('{secret}')) TO '{out}' (FORMAT CSV); "
        "SELECT CAST(1 AS VARCHAR"
    )


def _closes_the_null(secret: Path, out: Path) -> str:
    """A "type" that ends ``NULL::...`` and the statement, then copies ``secret`` to ``out``."""
    copy = f"COPY (SELECT content FROM read_text('{secret}')) TO '{out}' (FORMAT CSV)"
    return f"VARCHAR AS c0; {copy}; SELECT NULL::VARCHAR"


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_NATS_CREDS")}
    return support.vigil(*args, timeout=60, env=env)


@pytest.mark.parametrize(
    "command",
    [["runs"], ["sql", "select run_id from runs"], ["export", "r1", "--format", "csv"]],
    ids=["runs", "sql", "export"],
)
def test_a_rogue_shard_on_an_open_bus_cannot_run_sql_on_the_operators_machine(
    private_nats_server: support.NatsServer, tmp_path: Path, command: list[str]
) -> None:
    secret, out = _secret(tmp_path), tmp_path / "stolen.csv"
    evil = _closes_the_cast(secret, out)
    answer = QueryResult(columns=["known", "rows"], types=[evil, "BIGINT"], rows=[[1, 1]])
    with Rogue(private_nats_server.url, answer) as rogue:
        done = _run_cli(*command, "--nats", private_nats_server.url, "--data-dir", str(tmp_path / "none"))
    assert rogue.asked, "the CLI never asked the rogue shard: the attack was not tried"
    assert not out.exists(), f"a shard's reply ran SQL on this machine: {out} holds {out.read_text()!r}"
    assert done.returncode != 0, done.stdout
    assert "shard 0/1" in done.stderr and "column type" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("any local process can answer as a shard") == 1, done.stderr


def test_a_rogue_daemon_on_an_open_bus_cannot_run_sql_through_a_parquet_export(
    private_nats_server: support.NatsServer, tmp_path: Path
) -> None:
    """The Parquet writer asks DuckDB for the Arrow types of an answer's columns: from the parsed types only."""
    secret, out = _secret(tmp_path), tmp_path / "stolen.csv"
    answer = QueryResult(columns=["known", "rows"], types=[_closes_the_null(secret, out), "BIGINT"], rows=[[1, 1]])
    target = tmp_path / "r1.parquet"
    with Rogue(private_nats_server.url, answer, as_daemon=True) as rogue:
        done = _run_cli(
            "export", "r1", "--table", "events", "--format", "parquet", "-o", str(target),
            "--nats", private_nats_server.url, "--data-dir", str(tmp_path / "none"),
        )  # fmt: skip
    assert rogue.asked, "the CLI never asked the rogue daemon: the attack was not tried"
    assert not out.exists(), f"a daemon's reply ran SQL on this machine: {out} holds {out.read_text()!r}"
    assert done.returncode != 0 and not target.exists(), done.stderr
    assert "column type" in done.stderr and "Traceback" not in done.stderr, done.stderr


# ---- with --auth, only the daemon role answers ---------------------------------------------------------


class _ShardOfOne(support.Daemon):
    """``vigil up --shard 0/1`` with the daemon's credentials; it answers on its shard's subject only, so
    :meth:`sql` asks across shards as ``access`` (never the file: its data directory holds none)."""

    def __init__(self, url: str, data_dir: Path, creds: Path, access: BusAccess) -> None:
        env = {"VIGIL_NATS_CREDS": str(creds), "VIGIL_STREAM_MAX_BYTES": str(2**30)}
        super().__init__(url, data_dir, "--shard", "0/1", "--http-port", "0", env=env)  # no web view needed
        self.access = access

    def sql(self, sql: str) -> QueryResult:
        where = self.data_dir.parent / "no-history"
        with QuerySource(nats_url=self.nats_url, data_dir=where, timeout=30, access=self.access) as source:
            return source.ask(sql, 100_000)


def test_with_auth_an_agent_or_reader_cannot_answer_as_a_shard_and_the_readers_runs_are_the_shards(
    tmp_path: Path,
) -> None:
    """The generated permissions let no role but the daemon's receive a roll call or a shard's query: an agent's
    and a reader's credentials are refused the subscriptions, and ``vigil runs`` gets the real shard's answer."""
    bus = tmp_path / "bus"
    assert support.vigil("auth", str(bus), "--shards", "1").returncode == 0
    server = support.NatsServer(tmp_path / "js", config_file=bus / "nats-server.conf")
    server.start()
    reader = BusAccess(creds=str(bus / "reader.toml"))
    shard = _ShardOfOne(server.url, tmp_path / "data", bus / "daemon.toml", reader)
    try:
        shard.start()
        secret, out = _secret(tmp_path), tmp_path / "stolen.csv"
        evil = QueryResult(columns=["known", "rows"], types=[_closes_the_cast(secret, out), "BIGINT"], rows=[[1, 1]])
        as_agent = BusAccess(creds=str(bus / "agent.toml"))
        with Rogue(server.url, evil, access=as_agent) as agent, Rogue(server.url, evil, access=reader) as other:
            done = _run_cli(
                "runs", "--nats", server.url, "--creds", str(bus / "reader.toml"), "--format", "csv",
                "--data-dir", str(tmp_path / "no-history"),
            )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[0].startswith("run_id,status"), done.stdout
        assert not out.exists()
        for rogue in (agent, other):
            assert not rogue.asked
            for subject in (DEFAULT_SUBJECTS.roll_call, ShardId(0, 1).query_subject):
                refused = f'subscription to "{subject}"'
                assert any(refused in v.lower() for v in rogue.violations), rogue.violations
        assert "any local process" not in done.stderr, done.stderr
        assert shard.terminate() == 0
    finally:
        if shard.process is not None and shard.process.poll() is None:
            shard.kill()
        server.stop()


# ---- the types' grammar (pure) ------------------------------------------------------------------------

EVERY_TYPE = {
    "b": "true",
    "i8": "-3::tinyint",
    "i16": "300::smallint",
    "i32": "70000",
    "i64": "1099511627776::bigint",
    "h": "(2::hugeint ** 100)::hugeint",
    "u8": "200::utinyint",
    "u16": "60000::usmallint",
    "u32": "4000000000::uinteger",
    "u64": "18446744073709551615::ubigint",
    "uh": "1::uhugeint",
    "f": "1.5::float",
    "d": "1 / 3",
    "dec": "123.456::decimal(18,3)",
    "dec38": "1.5::decimal(38,10)",
    "dec1": "0.5::decimal(1,1)",
    "s": "'x''\"y'",
    "bl": "'\\x00ab'::blob",
    "dt": "date '2024-02-29'",
    "t": "time '12:34:56.789'",
    "tns": "'12:00:00.123456789'::time_ns",
    "ttz": "'12:00:00+01'::timetz",
    "ts": "timestamp '2024-01-01 01:02:03.456789'",
    "tz": "timestamptz '2024-01-01 01:02:03+02'",
    "tss": "timestamp_s '2024-01-01 01:02:03'",
    "tsms": "'2024-01-01 01:02:03.5'::timestamp_ms",
    "tsns": "'2024-01-01 01:02:03.123456789'::timestamp_ns",
    "tzns": "'2024-01-01 01:02:03.123456789+00'::timestamptz_ns",
    "iv": "interval '1 day 2 hours'",
    "uu": "'5b8e2f0c-4c0e-4f2b-9d3e-2f1a1b0c9d8e'::uuid",
    "js": "'{\"a\": [1, 2]}'::json",
    "bit": "'101'::bit",
    "bn": "12345678901234567890123::bignum",
    "nul": "null",
    "li": "[1, 2, null]",
    "lli": "[[1], []]",
    "lts": "[timestamp '2024-01-01']",
    "ar": "[1, 2, 3]::int[3]",
    "lar": "[[1, 2]::int[2]]",
    "st": "{'a': 1, 'b c': 'x', 'q\"uote': [1.5]}",
    "mp": "map(['k'], [1.5::double])",
    "nested": "[{'m': map([1], [[timestamptz '2024-01-01 00:00:00+00']])}]",
}
"""A column of every type a daemon sends (the steps table's ``extra`` is a MAP(VARCHAR, DOUBLE))."""


@pytest.fixture(scope="module")
def every_type() -> QueryResult:
    """The daemon's own answer (``run_query``) over a row holding every type."""
    con = duckdb.connect()
    return run_query(con, "SELECT " + ", ".join(f"{e} AS {n}" for n, e in EVERY_TYPE.items()), 10, 10)


def test_every_type_a_daemon_sends_parses_and_renders_back_to_the_same_type(every_type: QueryResult) -> None:
    con = sandboxed()
    for name, text, t in zip(every_type.columns, every_type.types, every_type.column_types(), strict=True):
        rendered = render(t)
        assert parse_type(rendered) == t, name
        back = con.sql(f"SELECT CAST(NULL AS {rendered}) AS x").types[0]
        assert str(back) == text, (name, rendered)


def test_types_a_client_would_refuse_are_sent_as_varchar_with_their_text() -> None:
    con = duckdb.connect()
    sql = "SELECT 'a'::enum('a', 'b') AS e, union_value(k := 1) AS u, 1::variant AS v, [union_value(k := 2)] AS lu"
    answer = run_query(con, sql, 10, 10)
    assert answer.types == ["VARCHAR"] * 4
    assert answer.rows == [["a", "1", "1", "[2]"]]


@pytest.mark.parametrize(
    "text",
    [
        _closes_the_cast(Path("/home/op/.ssh/id_ed25519"), Path("/tmp/out")),
        _closes_the_null(Path("/home/op/.ssh/id_ed25519"), Path("/tmp/out")),
        "INTEGER; SELECT 1",
        "INTEGER)",
        "VARCHAR --",
        "VARCHAR COLLATE nocase",
        "VARCHAR ",
        " VARCHAR",
        "integer",
        '"INTEGER"',
        "",
        "DECIMAL(39,1)",
        "DECIMAL(3,4)",
        "DECIMAL(0,0)",
        "DECIMAL(18)",
        "DECIMAL(1000000,1)",
        "INTEGER[0]",
        "INTEGER[100001]",
        "INTEGER[-1]",
        "INTEGER[",
        "STRUCT()",
        "STRUCT(a INTEGER, A VARCHAR)",
        'STRUCT("a" INTEGER',
        'STRUCT("" INTEGER)',
        "STRUCT(a INTEGER) x",
        'STRUCT(a" INTEGER)',
        "STRUCT(a INTEGER); COPY (SELECT 1) TO 'x'",
        "MAP(VARCHAR)",
        "MAP(VARCHAR, DOUBLE",
        "ENUM('a', 'b')",
        "UNION(k INTEGER)",
        "GEOMETRY",
        "VARIANT",
        "TIMESTAMP WITH TIME ZONE; DROP TABLE partials",
        "TIME WITH ZONE",
        "INTEGER\x00; COPY (SELECT 1) TO 'x'",
        "INTEGER" + "[]" * 17,
        "STRUCT(a " * 17 + "INTEGER" + ")" * 17,
        "VARCHAR" + " " * 70_000,
    ],
)
def test_crafted_type_text_is_refused(text: str) -> None:
    with pytest.raises(ColumnTypeError, match="column type"):
        parse_type(text)


def test_deep_but_bounded_nesting_and_wide_decimals_are_accepted() -> None:
    assert parse_type("INTEGER" + "[]" * 16) is not None
    assert parse_type("DECIMAL(38,38)") == Decimal(38, 38)
    assert parse_type('STRUCT("x""y" MAP(VARCHAR, INTEGER[2]))') == Struct(
        (('x"y', Map(Scalar.VARCHAR, Array(Scalar.INTEGER, 2))),)
    )


FIELD_NAMES = ['a"b', '") AS x FROM wire; SELECT ("', "nul\x00byte", "new\nline", "it's", "é", "select", "b c"]
"""Names an answer may carry (columns, struct fields): each must reach SQL as one quoted identifier."""


def test_struct_field_names_are_quoted_whatever_they_hold() -> None:
    con = sandboxed()
    literal = ", ".join(f"{quote_identifier(n)} INTEGER" for n in FIELD_NAMES)
    text = str(con.sql(f"SELECT CAST(NULL AS STRUCT({literal})) AS s").types[0])  # as DuckDB names it
    t = parse_type(text)
    assert isinstance(t, Struct) and [name for name, _ in t.fields] == FIELD_NAMES
    assert str(con.sql(f"SELECT CAST(NULL AS {render(t)}) AS s").types[0]) == text


# ---- the merge over real answers ----------------------------------------------------------------------


def _gathered(*answers: QueryResult) -> Gathered:
    return Gathered(len(answers), dict(enumerate(answers)))


def test_shards_answers_of_every_type_merge_to_the_answer_of_one_history() -> None:
    """Two shards (real DuckDB, the daemon's own answers) merged equal the one history they split."""
    select = ", ".join(f"{e} AS {n}" for n, e in EVERY_TYPE.items())
    shards = [duckdb.connect() for _ in range(2)]
    for k, con in enumerate(shards):
        con.execute(f"CREATE TABLE t AS SELECT {k} AS id, {select}")
    whole = duckdb.connect()
    whole.execute(f"CREATE TABLE t AS SELECT 0 AS id, {select} UNION ALL SELECT 1 AS id, {select}")
    for sql in ["SELECT * FROM t ORDER BY id DESC", "SELECT count(*), max(dec), min(tz), any_value(mp) FROM t"]:
        split = plan(sql)
        merged = merge(split, _gathered(*(run_query(con, split.shard_sql, 100, 10) for con in shards)), 100, 10)
        expected = run_query(whole, sql, 100, 10)
        assert (merged.columns, merged.types, merged.rows) == (expected.columns, expected.types, expected.rows), sql


def test_column_names_from_an_answer_are_names_never_sql(tmp_path: Path) -> None:
    secret, out = _secret(tmp_path), tmp_path / "stolen.csv"
    names = [*FIELD_NAMES, f"x\" FROM wire; COPY (SELECT content FROM read_text('{secret}')) TO '{out}'; --"]
    answer = QueryResult(columns=names, types=["INTEGER"] * len(names), rows=[list(range(len(names)))])
    merged = merge(plan("SELECT * FROM t"), _gathered(answer), 10, 10)
    assert merged.columns == names and merged.rows == [list(range(len(names)))]
    assert not out.exists()


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (QueryResult(columns=["a"], types=["INTEGER", "INTEGER"], rows=[[1]]), "2 column types"),
        (QueryResult(columns=["a", "b"], types=["INTEGER", "INTEGER"], rows=[[1]]), "do not line up"),
        (QueryResult(columns=["a"], types=["ENUM('x')"], rows=[["x"]]), "not a column type"),
    ],
)
def test_an_answer_that_is_not_a_daemons_fails_naming_the_shard(answer: QueryResult, says: str) -> None:
    good = QueryResult(columns=answer.columns, types=["INTEGER"] * len(answer.columns), rows=[])
    with pytest.raises(QueryError, match=f"shard 1/2: .*{re.escape(says)}|shard 1/2 .*{re.escape(says)}"):
        merge(plan("SELECT * FROM t"), _gathered(good, answer), 10, 10)


# ---- the locked DuckDB --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT content FROM read_text('{secret}')",
        "COPY (SELECT 1) TO '{out}'",
        "ATTACH '{out}' AS other",
        "INSTALL httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "RESET enable_external_access",
    ],
)
def test_the_clis_duckdb_cannot_reach_files_nor_be_unlocked(tmp_path: Path, sql: str) -> None:
    secret, out = _secret(tmp_path), tmp_path / "out"
    con = sandboxed()
    with pytest.raises(duckdb.Error):
        con.execute(sql.format(secret=secret, out=out))
    with pytest.raises(duckdb.PermissionException):
        con.execute(f"SELECT content FROM read_text('{secret}')")
    assert not out.exists()


def test_the_merge_runs_in_the_locked_duckdb(tmp_path: Path) -> None:
    secret = _secret(tmp_path)
    reads = ShardPlan("SELECT 1 AS a", f"SELECT content FROM read_text('{secret}')", "rows", True)
    answer = QueryResult(columns=["a"], types=["INTEGER"], rows=[[1]])
    with pytest.raises(QueryRefusedError, match="file and network access"):
        merge(reads, _gathered(answer), 10, 10)


def test_every_duckdb_the_cli_opens_is_the_locked_one() -> None:
    """Only the sandbox opens an in-memory DuckDB for the CLI and the planner (the history file opens read-only and
    locked too)."""
    daemon = Path(__file__).resolve().parents[2] / "daemon"
    files = [daemon / "sandbox.py", *(daemon / "cli").glob("*.py"), *(daemon / "shards").glob("*.py")]
    opens = sorted(p.name for p in files if "duckdb.connect(" in p.read_text())
    assert opens == ["sandbox.py"]
    assert _Planner("SELECT 1").con.execute("SELECT current_setting('enable_external_access')").fetchone() == (False,)


def test_merging_on_an_open_bus_warns_once_per_command(
    private_nats_server: support.NatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any process can answer as a shard without credentials: a well-formed answer is merged, and said so."""
    answer = QueryResult(columns=["n"], types=["BIGINT"], rows=[[7]])
    with (
        Rogue(private_nats_server.url, answer) as rogue,
        QuerySource(nats_url=private_nats_server.url, data_dir=tmp_path / "none", timeout=10) as source,
    ):
        assert [source.ask("SELECT n FROM t", 10).rows for _ in range(2)] == [[[7]], [[7]]]
    assert len(rogue.asked) >= 2
    assert capsys.readouterr().err.count("any local process can answer as a shard") == 1


@pytest.mark.parametrize(
    ("url", "creds", "is_open"),
    [
        ("nats://127.0.0.1:4222", "", True),
        ("nats://127.0.0.1:4222", "/etc/vigil/reader.toml", False),
        ("nats://reader:secret@127.0.0.1:4222", "", False),
        ("nats://a:4222,nats://token@b:4222", "", False),
    ],
)
def test_a_bus_is_open_when_the_client_has_no_credentials(url: str, creds: str, is_open: bool) -> None:
    assert open_bus(url, BusAccess(creds=creds)) is is_open
