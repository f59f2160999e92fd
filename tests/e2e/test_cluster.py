"""Beyond one machine: a NATS cluster with a replicated stream, daemon shards, and queries across them.

Real nats-server processes on loopback (``bench/_cluster.py``), real daemons (``vigil up --shard``),
real agents in separate processes (``tests/_support/cluster_producer.py``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import nats
import pytest
import support
from support import HERE, ROOT, ShardDaemon, wait_for

from trainvigil.daemon import config as config_mod
from trainvigil.daemon.broker.embedded import find_binary, free_port, port_open, server_args
from trainvigil.daemon.cli.sqlclient import QuerySource
from trainvigil.daemon.shards import plan
from trainvigil.errors import ConfigError, QueryRefusedError
from trainvigil.schemas import DEFAULT_SUBJECTS
from trainvigil.schemas.query import QueryResult
from trainvigil.schemas.shards import ShardId, shard_of
from trainvigil.testing import NatsCluster

SHARDS = 2


vigil = functools.partial(support.vigil, timeout=60)
"""The ``vigil`` command line as a user runs it."""


def across(url: str, sql: str) -> QueryResult:
    """``sql`` answered across every shard (what ``vigil sql`` does), with no shard missing."""
    with QuerySource(nats_url=url, data_dir="/nonexistent", timeout=30) as source:
        result = source.ask(sql, 100_000)
        assert not source.missing, source.warning
        return result


def produce(
    url: str, steps: int, agents: list[str], *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``tests/_support/cluster_producer.py``: one agent per ``RUN:RANK[:STEP_TIME]`` in one process."""
    path = os.pathsep.join(filter(None, [str(HERE), str(ROOT / "bench"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "VIGIL_NATS_URL": url, "VIGIL_ACK_TIMEOUT": "2", "PYTHONPATH": path, **(env or {})}
    cmd = [sys.executable, str(HERE / "cluster_producer.py"), str(steps), *agents, *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finished(proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-3000:]


def _running(root: Path, nodes: int) -> Iterator[NatsCluster]:
    """``nodes`` NATS nodes mapping runs over SHARDS shards, stopped at the end."""
    cluster = NatsCluster(root, nodes=nodes, shards=SHARDS)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    yield from _running(tmp_path / "nats", 3)


STREAM_BYTES = 2**30
"""Each shard's stream limit here: far above what a test writes, and no reservation that a disk with a few
GiB free refuses."""


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[NatsCluster]:
    yield from _running(tmp_path / "nats", 1)


@pytest.fixture
def start_shards(tmp_path: Path) -> Iterator[Callable[[str, dict[str, str]], list[ShardDaemon]]]:
    """Start SHARDS daemons against a broker; whatever still runs at the end is killed."""
    started: list[ShardDaemon] = []

    def start(url: str, env: dict[str, str]) -> list[ShardDaemon]:
        # Each shard's stream reserves its max_bytes on every node that holds it, and nats-server refuses a
        # stream past ~75 % of the free disk: at the default 10 GiB, two R3 shards need 27 GiB free per node.
        env = {"VIGIL_STREAM_MAX_BYTES": str(STREAM_BYTES), **env}
        shards = [ShardDaemon(url, tmp_path / f"s{i}", ShardId(i, SHARDS), env=env) for i in range(SHARDS)]
        for d in shards:
            d.start()
            started.append(d)
        return shards

    yield start
    for d in started:
        if d.process is not None and d.process.poll() is None:
            d.kill()


def _stream_leader_and_replicas(url: str, stream: str) -> tuple[str, int]:
    async def ask() -> tuple[str, int]:
        nc = await nats.connect(url.split(","))
        try:
            info = await nc.jetstream().stream_info(stream)
            assert info.cluster is not None
            return str(info.cluster.leader), int(info.config.num_replicas or 1)
        finally:
            await nc.close()

    return asyncio.run(ask())


def _total(shards: list[ShardDaemon]) -> int:
    """Steps stored across ``shards``; -1 while one does not answer (reconnecting to another NATS node)."""
    try:
        return sum(int(d.scalar("select count(*) from steps")) for d in shards)
    except AssertionError:
        return -1


@pytest.mark.slow
def test_a_node_whose_port_was_taken_since_it_was_picked_starts_on_new_ports(tmp_path: Path) -> None:
    """CI once saw a node never listen: its port, free when picked, was bound by the time it started."""
    cluster = NatsCluster(tmp_path / "nats", nodes=3, shards=SHARDS)
    with socket.socket() as taken:  # bound, not listening: as an outgoing connection's port
        taken.bind(("127.0.0.1", cluster.client_ports[2]))
        try:
            cluster.start()
            assert cluster.client_ports[2] != taken.getsockname()[1]
            assert "address already in use" in (tmp_path / "nats" / "n2.log").read_text()
            assert cluster.jetstream_ready()
        finally:
            cluster.stop()


@pytest.mark.timeout(120)  # ~20 s of paced agents while a node and a shard are killed: ~38 s
def test_a_cluster_loses_and_repeats_nothing_when_a_nats_node_and_a_shard_are_killed(
    cluster: NatsCluster, start_shards: Callable[[str, dict[str, str]], list[ShardDaemon]]
) -> None:
    """3 NATS nodes, R3 streams, 2 shards, 8 runs from 4 agent processes; SIGKILL the node leading shard 0's
    stream and, separately, shard 1 (restarted 5 s later): every step stored once, each run on its one shard."""
    # The shape to hold: 4 agent processes x 50 000 steps across 8 runs, paced to last ~20 s.
    steps, pace = 25_000, 0.0008
    shards = start_shards(cluster.url, {"VIGIL_STREAM_REPLICAS": "3"})
    for i in range(SHARDS):
        leader, replicas = _stream_leader_and_replicas(cluster.url, f"VIGIL-{i}")
        assert replicas == 3 and leader
    runs = [f"run-{i}" for i in range(8)]
    assert {shard_of(r, SHARDS) for r in runs} == set(range(SHARDS)), "both shards get runs"
    producers = [
        produce(cluster.url, steps, [f"{runs[2 * p]}:0", f"{runs[2 * p + 1]}:0"], "--pace", str(pace)) for p in range(4)
    ]
    try:
        wait_for(
            lambda: all(d.scalar("select count(*) from steps") > 0 for d in shards), 30, "both shards to store steps"
        )
        leader, _ = _stream_leader_and_replicas(cluster.url, "VIGIL-0")
        cluster.kill(int(leader.removeprefix("n")))
        before = wait_for(lambda: _total(shards) + 1, 30, "both shards to answer through the other nodes") - 1
        wait_for(lambda: _total(shards) > before + 100, 30, "ingest to go on without the killed node")

        shards[1].kill()
        killed_at = time.monotonic()
        down = vigil("sql", "--nats", cluster.url, "--format", "csv", "select count(*) from steps")
        assert down.returncode == 5, down.stderr
        assert "shard 1/2" in down.stderr and "partial answer" in down.stderr, down.stderr
        assert int(down.stdout.splitlines()[-1]) > 0  # shard 0's rows: the rest is still answered
        time.sleep(max(0.0, 5.0 - (time.monotonic() - killed_at)))  # the scenario: down for 5 s
        shards[1].start()
        for proc in producers:
            finished(proc)
    finally:
        for proc in producers:
            if proc.poll() is None:
                proc.kill()

    total = len(runs) * steps
    wait_for(lambda: _total(shards) >= total, 60, f"{total} steps across the shards")
    seen: dict[str, int] = {}
    for d in shards:
        rows, distinct = d.sql("select count(*), count(distinct (run_id, rank, step)) from steps").rows[0]
        assert rows == distinct, f"shard {d.shard} stored duplicates"
        for run_id, n in d.sql("select run_id, count(*) from steps group by 1").rows:
            assert run_id not in seen, f"{run_id} is on two shards"
            assert shard_of(run_id, SHARDS) == d.shard.index, f"{run_id} on the wrong shard"
            seen[run_id] = n
    assert seen == dict.fromkeys(runs, steps)
    answer = vigil("sql", "--nats", cluster.url, "--format", "csv", "select count(*) from steps")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.splitlines() == ["count_star()", str(total)]
    per_run = across(
        cluster.url, "select run_id, count(*) n, max(step) from steps group by 1 order by n desc, 1 limit 3"
    )
    assert per_run.rows == [[r, steps, steps - 1] for r in sorted(runs)[:3]]
    for d in shards:
        assert d.terminate() == 0


def test_a_straggler_rank_of_a_sharded_run_is_caught_on_the_shard_that_owns_the_run(
    one_node: NatsCluster, start_shards: Callable[[str, dict[str, str]], list[ShardDaemon]]
) -> None:
    """Both ranks of a run land on one shard, whose straggler detector names the slow rank."""
    env = {"VIGIL_DETECTORS_STRAGGLER_MIN_STEPS": "10", "VIGIL_DETECTORS_STRAGGLER_MIN_SECONDS": "1"}
    shards = start_shards(one_node.url, env)
    run_id = "straggling-run"
    owner = shards[shard_of(run_id, SHARDS)]
    finished(produce(one_node.url, 200, [f"{run_id}:0:0.1", f"{run_id}:1:0.4"], "--world", "2", "--pace", "0.005"))

    def caught() -> list[list[Any]]:
        return across(one_node.url, "select run_id, rank from anomalies where detector = 'straggler'").rows

    assert wait_for(caught, 30, "a straggler alert") == [[run_id, 1]]
    assert owner.scalar("select count(distinct rank) from steps") == 2
    assert all(d.scalar("select count(*) from steps") == 0 for d in shards if d is not owner)
    # `vigil runs` across the shards: a GROUP BY ALL with per-run subqueries, times sent as text and typed back.
    runs = vigil("runs", "--nats", one_node.url, "--format", "json")
    assert runs.returncode == 0, runs.stderr
    (row,) = [json.loads(line) for line in runs.stdout.splitlines()]
    assert (row["run_id"], row["world_size"], row["steps"], row["last_step"]) == (run_id, 2, 400, 199)


def test_a_shard_refuses_to_start_against_a_broker_that_partitions_over_another_count(
    one_node: NatsCluster, tmp_path: Path
) -> None:
    """The broker maps runs over 2 shards; ``--shard 0/3`` would own runs nobody sends it: it says so and exits 2."""
    done = vigil("up", "--nats", one_node.url, "--shard", "0/3", "--data-dir", str(tmp_path / "d"), "--http-port", "0")
    assert done.returncode == 2, done.stderr
    assert "vigil shards mappings 3" in done.stderr and "another number of shards" in done.stderr


def test_a_shard_refuses_to_start_against_a_broker_without_the_mappings(nats_server: Any, tmp_path: Path) -> None:
    done = vigil(
        "up", "--nats", nats_server.url, "--shard", "1/2", "--data-dir", str(tmp_path / "d"), "--http-port", "0"
    )
    assert done.returncode == 2, done.stderr
    assert "does not partition runs" in done.stderr and "vigil shards mappings 2" in done.stderr


def test_shards_on_a_broker_with_users_ingest_from_agents_and_answer_readers(
    tmp_path: Path, start_shards: Callable[[str, dict[str, str]], list[ShardDaemon]]
) -> None:
    """``vigil auth DIR --shards 2`` puts the mappings in the users' account: agents publish with their
    permissions, shards store, a reader's roll call and shard queries are allowed."""
    bus = tmp_path / "bus"
    assert vigil("auth", str(bus), "--shards", str(SHARDS)).returncode == 0
    port = free_port()
    argv = server_args(find_binary(), port, tmp_path / "js", config_file=bus / "nats-server.conf")
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"nats://127.0.0.1:{port}"
        wait_for(lambda: port_open("127.0.0.1", port), 10, "nats-server to listen")
        shards = start_shards(url, {"VIGIL_NATS_CREDS": str(bus / "daemon.toml")})
        runs = ["secured-a", "secured-b", "secured-c", "secured-d"]
        assert {shard_of(r, SHARDS) for r in runs} == set(range(SHARDS))
        env = {"VIGIL_NATS_CREDS": str(bus / "agent.toml")}
        finished(produce(url, 50, [f"{r}:0" for r in runs], env=env))
        reader = ["--nats", url, "--creds", str(bus / "reader.toml"), "--format", "csv"]
        counted = wait_for(
            lambda: (done := vigil("sql", *reader, "select count(*) from steps")).stdout.endswith("\n200\n") and done,
            30,
            "200 steps across the shards",
        )
        assert counted.returncode == 0, counted.stderr
        for d in shards:
            d.terminate()
    finally:
        server.terminate()
        server.wait(10)


def test_vigil_shards_prints_the_mappings_and_the_shard_of_a_run() -> None:
    mappings = vigil("shards", "mappings", "4")
    assert mappings.returncode == 0
    assert '"vigil.v1.*.metrics": "vigil.v1.{{partition(4,1)}}.{{wildcard(1)}}.metrics"' in mappings.stdout
    which = vigil("shards", "which", "run/7", "4")
    assert which.stdout.strip() == f"{shard_of('run/7', 4)}/4"


# ---- configuration -----------------------------------------------------------------------------------


def test_without_a_shard_the_daemon_keeps_its_one_stream_consumer_and_subjects() -> None:
    cfg = config_mod.load(env={})
    assert cfg.for_shard() is cfg and cfg.shard_id is None
    assert cfg.stream_subjects == DEFAULT_SUBJECTS.stream_subjects and cfg.stream.replicas == 1
    assert (cfg.stream.name, cfg.stream.consumer) == ("VIGIL", "vigil-daemon")


def test_a_shard_has_its_own_stream_consumer_and_partition_subjects() -> None:
    env = {"VIGIL_SHARD": "1/4", "VIGIL_NATS_URL": "nats://a:4222, nats://b:4222", "VIGIL_STREAM_REPLICAS": "3"}
    cfg = config_mod.load(env=env).for_shard()
    assert (cfg.stream.name, cfg.stream.consumer, cfg.stream.replicas) == ("VIGIL-1", "vigil-daemon-1", 3)
    assert cfg.stream_subjects == [f"vigil.v1.1.*.{k}" for k in ("metrics", "gil", "ckpt", "run", "hb")]
    assert config_mod.nats_servers(cfg.nats_url) == ["nats://a:4222", "nats://b:4222"]


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"VIGIL_SHARD": "2/2", "VIGIL_NATS_URL": "nats://a:1"}, "0 <= INDEX < COUNT"),
        ({"VIGIL_SHARD": "zero", "VIGIL_NATS_URL": "nats://a:1"}, "INDEX/COUNT like 0/2"),
        ({"VIGIL_SHARD": "0/2"}, "given with nats_url"),
        ({"VIGIL_STREAM_REPLICAS": "7"}, "stream.replicas"),
        ({"VIGIL_NATS_URL": "nats://a:1,b"}, "several comma-separated"),
    ],
)
def test_cluster_settings_out_of_range_fail_at_load_naming_the_key(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        config_mod.load(env=env)


# ---- merging answers across shards (pure: two DuckDB files stand for two shards) ------------------------

MERGED = [
    "select count(*) from steps",
    "select run_id, count(*) as n, avg(loss) from steps group by 1 order by 1",
    "select run_id, max(step) from steps group by run_id having count(*) > 10 order by 2 desc, 1 limit 3",
    "select * from steps order by loss desc nulls last, run_id, rank, step limit 5 offset 2",
    "select run_id, rank, step from steps where step = 3 order by 1, 2",
    "select distinct run_id from steps order by 1",
    "select count(distinct run_id), median(loss) from steps",
    "select run_id, string_agg(cast(step as varchar), ',' order by step) filter (where step < 3) from steps "
    "group by 1 order by 1",
    "select round(avg(loss) * 100, 2) as pct, count(*) filter (where loss is null) nulls from steps",
    "with t as (select run_id, max(step) m from steps group by 1) select count(*), sum(m) from t",
    "select rank % 2 as parity, sum(step) from steps group by rank % 2 order by 1",
    "select r.run_id, r.status, count(s.step) steps from runs r left join steps s using (run_id) "
    "group by all order by 1",
    "select (select count(*) from runs where run_id = 'r1') as known, (select count(*) from steps where "
    "run_id = 'r1') as rows, (select avg(loss) from steps) mean, 'x' as tag",
    "select 1",
]


@pytest.fixture(scope="module")
def split_history() -> tuple[list[duckdb.DuckDBPyConnection], duckdb.DuckDBPyConnection]:
    """Two shards' tables (runs split by partition) and the one table they add up to."""
    shards, whole = [duckdb.connect() for _ in range(SHARDS)], duckdb.connect()
    for con in [*shards, whole]:
        con.execute("create table steps(run_id varchar, rank int, step int, loss double)")
        con.execute("create table runs(run_id varchar, status varchar)")
    for r in range(6):
        run_id = f"r{r}"
        home = shards[shard_of(run_id, SHARDS)]
        for con in (home, whole):
            con.execute("insert into runs values (?, 'running')", [run_id])
            con.executemany(
                "insert into steps values (?, ?, ?, ?)",
                [(run_id, k, s, None if s % 7 == 0 else (s * 37 % 11) / 7.0) for k in range(2) for s in range(20)],
            )
    return shards, whole


@pytest.mark.parametrize("sql", MERGED)
def test_the_merged_answer_of_the_shards_equals_the_answer_of_one_history(
    split_history: tuple[list[duckdb.DuckDBPyConnection], duckdb.DuckDBPyConnection], sql: str
) -> None:
    shards, whole = split_history
    split = plan(sql)
    partials = duckdb.connect()
    parts = [con.sql(split.shard_sql).to_arrow_table() for con in shards]
    partials.register("wire", parts[0])
    partials.execute("create table partials as select * from wire")
    partials.register("wire", parts[1])
    partials.execute("insert into partials select * from wire")
    merged = partials.sql(split.merge_sql)
    expected = whole.sql(sql)
    assert merged.columns == expected.columns
    # Sums of floats may differ in the last bit: the shards add in another order.
    assert merged.fetchall() == [
        tuple(pytest.approx(v) if isinstance(v, float) else v for v in row) for row in expected.fetchall()
    ]


def test_count_star_moves_one_row_per_shard() -> None:
    split = plan("select count(*) from steps")
    assert split.mode == "partial" and "GROUP BY" not in split.shard_sql


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("select run_id, row_number() over () from steps", "window"),
        ("select run_id, count(*) from steps group by rollup (run_id)", "ROLLUP"),
        ("select 1 union select 2", "one SELECT"),
    ],
)
def test_what_cannot_be_merged_across_shards_is_refused_with_what_to_do(sql: str, says: str) -> None:
    with pytest.raises(QueryRefusedError, match=says):
        plan(sql)
