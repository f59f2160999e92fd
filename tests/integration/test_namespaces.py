"""Namespaces on one real nats-server: a daemon of namespace ``alpha`` and one of the default namespace run side
by side, each storing, answering and alerting on its own namespace's runs only; a second daemon of one
namespace is still refused, and a bad namespace stops ``vigil up`` and ``trainvigil.init`` with a clear error."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import msgspec
import nats
import nats.errors
import pytest
from follower import Follower
from support import Daemon, NatsServer, finish, run_producer, vigil, wait_for

import trainvigil
from trainvigil.agents.spill.outbox import OutMsg, frame, write_sealed
from trainvigil.agents.spill.push import broker_key
from trainvigil.daemon.broker.holders import unsharded_holder
from trainvigil.daemon.cli.sqlclient import ask_daemon
from trainvigil.errors import ConfigError
from trainvigil.schemas import DEFAULT_SUBJECTS, Envelope, RunEvent, Source, Subjects, encode
from trainvigil.schemas.query import QueryRequest, QueryResult
from trainvigil.schemas.shards import ShardId

ALPHA = "alpha"
STEPS = 60
EXIT_USAGE, EXIT_UNAVAILABLE = 2, 3
DEADLINE_S = 120
"""Each command's deadline: generous on a loaded machine; a hang fails instead of blocking the suite."""


class NamespacedDaemon(Daemon):
    """``vigil up`` with ``VIGIL_NAMESPACE``; :meth:`sql` asks on that namespace's query subject."""

    def __init__(self, nats_url: str, data_dir: Path, namespace: str, *extra: str) -> None:
        super().__init__(nats_url, data_dir, *extra, env={"VIGIL_NAMESPACE": namespace})
        self.subjects = Subjects(namespace)

    def sql(self, sql: str) -> QueryResult:
        request = QueryRequest(sql=sql, limit=100_000)
        result = asyncio.run(ask_daemon(self.nats_url, request, 30, self.access, subjects=self.subjects))
        assert result is not None, f"no daemon of namespace {self.subjects.namespace} answered"
        assert not result.error, result.error
        return result


@dataclass
class Bus:
    server: NatsServer
    alpha: NamespacedDaemon
    default: Daemon
    root: Path


def _runs(daemon: Daemon) -> set[str]:
    return {row[0] for row in daemon.sql("select run_id from runs").rows}


def _all_steps_stored(daemon: Daemon, run: str) -> bool:
    return bool(daemon.scalar(f"select count(*) from steps where run_id = '{run}'") == STEPS)


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    """One broker, the two daemons started side by side, and a run of each namespace fully stored."""
    root = tmp_path_factory.mktemp("namespaces")
    server = NatsServer(root / "jetstream")
    server.start()
    alpha = NamespacedDaemon(server.url, root / "alpha", ALPHA)
    default = Daemon(server.url, root / "default")
    try:
        alpha.launch()
        default.launch()
        alpha.wait_ready()
        default.wait_ready()
        spill = {"VIGIL_SPILL_DIR": str(root / "spill")}
        producers = [
            run_producer(server.url, "run-alpha", 0, STEPS, env={**spill, "VIGIL_NAMESPACE": ALPHA}),
            run_producer(server.url, "run-default", 0, STEPS, env=spill),
        ]
        for proc in producers:
            finish(proc)
        for daemon, run in ((alpha, "run-alpha"), (default, "run-default")):
            wait_for(partial(_all_steps_stored, daemon, run), 60, f"{run}'s steps")
        yield Bus(server, alpha, default, root)
    finally:
        for daemon in (alpha, default):
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.terminate()
        server.stop()


def test_each_daemon_stores_its_own_namespaces_runs_whole_and_nothing_of_the_other(bus: Bus) -> None:
    for daemon, mine, theirs in ((bus.alpha, "run-alpha", "default"), (bus.default, "run-default", "alpha")):
        steps = daemon.sql(f"select step from steps where run_id = '{mine}' order by step").rows
        assert [s for (s,) in steps] == list(range(STEPS))
        assert not [run for run in _runs(daemon) if run.endswith(theirs)], _runs(daemon)
        assert daemon.scalar("select count(*) from dead_letters") == 0


def test_each_namespace_has_its_own_stream_on_the_broker(bus: Bus) -> None:
    async def streams() -> dict[str, list[str]]:
        nc = await nats.connect(bus.server.url)
        try:
            js = nc.jetstream()
            return {name: (await js.stream_info(name)).config.subjects or [] for name in ("VIGIL", "VIGIL_alpha")}
        finally:
            await nc.close()

    found = asyncio.run(streams())
    assert found == {"VIGIL": DEFAULT_SUBJECTS.stream_subjects, "VIGIL_alpha": Subjects(ALPHA).stream_subjects}


@pytest.mark.parametrize("how", ["flag", "env"])
def test_vigil_sql_and_runs_answer_from_their_namespaces_daemon_only(bus: Bus, how: str, tmp_path: Path) -> None:
    """``--namespace`` and ``VIGIL_NAMESPACE`` alike; without either, the default namespace's daemon answers."""
    common = ["--nats", bus.server.url, "--data-dir", str(tmp_path / "none"), "--format", "csv"]
    flag, env = (["--namespace", ALPHA], None) if how == "flag" else ([], {**os.environ, "VIGIL_NAMESPACE": ALPHA})
    plain = {k: v for k, v in os.environ.items() if k != "VIGIL_NAMESPACE"}
    for command in (["sql", "select run_id from runs order by 1"], ["runs"]):
        spaced = vigil(*command, *common, *flag, env=env, timeout=DEADLINE_S)
        assert spaced.returncode == 0, spaced.stderr
        assert "run-alpha" in spaced.stdout and "run-default" not in spaced.stdout, spaced.stdout
        default = vigil(*command, *common, env=plain, timeout=DEADLINE_S)
        assert default.returncode == 0, default.stderr
        assert "run-default" in default.stdout and "run-alpha" not in default.stdout, default.stdout


def test_a_namespace_no_daemon_serves_gets_no_answer_from_the_others(bus: Bus, tmp_path: Path) -> None:
    asked = vigil("sql", "select 1", "--nats", bus.server.url, "--namespace", "beta", "--data-dir", str(tmp_path),
                  timeout=DEADLINE_S)  # fmt: skip
    assert asked.returncode == EXIT_UNAVAILABLE, asked.stdout + asked.stderr
    assert "no daemon answered" in asked.stderr and asked.stdout == ""


def test_the_default_namespaces_questions_are_never_answered_by_the_namespaced_daemon(bus: Bus) -> None:
    """Asked again and again (daemons answering one subject take turns in a queue group): always the right one;
    the question "which daemon holds the stream" too."""
    for _ in range(10):
        assert "run-alpha" not in _runs(bus.default) and "run-default" not in _runs(bus.alpha)

    async def holders() -> tuple[str | None, str | None]:
        nc = await nats.connect(bus.server.url)
        try:
            plain = await unsharded_holder(nc, look_s=5)
            spaced = await unsharded_holder(nc, look_s=5, subjects=Subjects(ALPHA))
            return (plain.data_dir if plain else None), (spaced.data_dir if spaced else None)
        finally:
            await nc.close()

    assert asyncio.run(holders()) == (str(bus.default.data_dir.resolve()), str(bus.alpha.data_dir.resolve()))


def test_a_second_daemon_of_the_same_namespace_is_still_refused(bus: Bus) -> None:
    second = vigil("up", "--nats", bus.server.url, "--namespace", ALPHA, "--data-dir", str(bus.root / "alpha-2"),
                   "--http-port", "0", timeout=DEADLINE_S)  # fmt: skip
    assert second.returncode == EXIT_USAGE, second.stderr
    assert "VIGIL_alpha" in second.stderr and str(bus.alpha.data_dir.resolve()) in second.stderr, second.stderr
    assert bus.alpha.process is not None and bus.alpha.process.poll() is None, "the first one keeps running"


def _follower(url: str, *flags: str) -> Follower:
    """``vigil alerts --follow --format json`` of the namespace its flags name (none: the default one)."""
    env = {k: v for k, v in os.environ.items() if k != "VIGIL_NAMESPACE"}
    return Follower("--format", "json", "--nats", url, *flags, env=env)


def _saw(follower: Follower, run_id: str) -> bool:
    return any(a["run_id"] == run_id and a["detector"] == "non_finite" for a in follower.seen())


def _nan_run(url: str, run_id: str, namespace: str, spill: Path) -> None:
    """An in-process agent of ``namespace`` whose loss turns NaN at step 5."""
    agent = trainvigil.init(run_id=run_id, nats_url=url, namespace=namespace, spill_dir=spill, flush_interval=0.05)
    for step in range(10):
        agent.log(step, loss=float("nan") if step == 5 else 1.0 / (step + 1))
    assert agent.close(timeout=30)


def test_alerts_follow_of_one_namespace_never_prints_the_others_alert(bus: Bus, tmp_path: Path) -> None:
    followers = {ALPHA: _follower(bus.server.url, "--namespace", ALPHA), "": _follower(bus.server.url)}
    try:
        assert "following alpha.vigil.v1.alerts.>" in followers[ALPHA].following()
        assert "following vigil.v1.alerts.>" in followers[""].following()
        _nan_run(bus.server.url, "nan-alpha", ALPHA, tmp_path)
        _nan_run(bus.server.url, "nan-default", "", tmp_path)
        wait_for(lambda: _saw(followers[ALPHA], "nan-alpha") and _saw(followers[""], "nan-default"), 60, "both pages")
        stored = "select count(*) from anomalies where detector = 'non_finite' and run_id = '{}'"
        assert bus.alpha.scalar(stored.format("nan-alpha")) == 1 and bus.alpha.scalar(stored.format("nan-default")) == 0
        assert bus.default.scalar(stored.format("nan-default")) == 1
    finally:
        for follower in followers.values():
            follower.stop()
    assert {a["run_id"] for a in followers[ALPHA].seen()} == {"nan-alpha"}, followers[ALPHA].alerts
    assert {a["run_id"] for a in followers[""].seen()} == {"nan-default"}, followers[""].alerts


def test_vigil_push_delivers_a_spill_file_to_its_own_namespace_only(bus: Bus, tmp_path: Path) -> None:
    """Pushed without its namespace it is refused, naming both, and left as it is; with it, it goes to its daemon."""
    spaced = Subjects(ALPHA)
    path = tmp_path / "pushed-r0-p1-n.spill"
    envelopes = [
        Envelope(source=Source(run_id="pushed", host="h", pid=1), seq=i + 1,
                 records=[RunEvent(time=time.time(), kind="note", step=i)])
        for i in range(3)
    ]  # fmt: skip
    msgs = [OutMsg(spaced.data("pushed", "run"), f"pushed/0/h/1/n/{i}", encode(e), 1) for i, e in enumerate(envelopes)]
    write_sealed(path, broker_key(bus.server.url), (frame(m) for m in msgs))
    before = path.read_bytes()
    plain = {k: v for k, v in os.environ.items() if k != "VIGIL_NAMESPACE"}
    refused = vigil("push", str(path), "--nats", bus.server.url, env=plain, timeout=DEADLINE_S)
    assert refused.returncode == 1, refused.stderr
    assert "namespace 'alpha'" in refused.stderr and "the default namespace" in refused.stderr, refused.stderr
    assert path.read_bytes() == before
    pushed = vigil("push", str(path), "--nats", bus.server.url, env={**plain, "VIGIL_NAMESPACE": ALPHA},
                   timeout=DEADLINE_S)  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    assert not path.exists()
    wait_for(lambda: bus.alpha.scalar("select count(*) from events where run_id = 'pushed'") == 3, 30, "the events")
    assert bus.default.scalar("select count(*) from events where run_id = 'pushed'") == 0


def test_namespaced_shards_partition_their_runs_and_vigil_sql_merges_them(tmp_path: Path) -> None:
    """The broker maps namespace alpha's subjects only (``vigil shards mappings 2 --namespace alpha``): its two
    shards split alpha's runs, and ``vigil sql --namespace alpha`` asks both."""
    mappings = vigil("shards", "mappings", "2", "--namespace", ALPHA, timeout=DEADLINE_S)
    assert mappings.returncode == 0 and '"alpha.vigil.v1.*.metrics"' in mappings.stdout, mappings.stdout
    conf = tmp_path / "nats.conf"
    conf.write_text(mappings.stdout)
    server = NatsServer(tmp_path / "jetstream", conf)
    server.start()
    shards = [ShardId(i, 2, Subjects(ALPHA)) for i in range(2)]
    daemons = [NamespacedDaemon(server.url, tmp_path / f"shard-{s.index}", ALPHA, "--shard", str(s)) for s in shards]
    runs = [f"s{i}" for i in range(6)]
    try:
        for daemon in daemons:
            daemon.launch()
        for shard in shards:
            wait_for(partial(_shard_answers, server.url, shard), 60, f"shard {shard}")
        spill = {"VIGIL_SPILL_DIR": str(tmp_path / "spill"), "VIGIL_NAMESPACE": ALPHA}
        for proc in [run_producer(server.url, run, 0, 5, env=spill) for run in runs]:
            finish(proc)
        sql = "select count(*) from steps"
        common = ["--nats", server.url, "--data-dir", str(tmp_path / "none"), "--format", "csv"]
        wait_for(lambda: vigil("sql", sql, *common, "--namespace", ALPHA).stdout.split() == ["count_star()", "30"],
                 60, "every shard's steps")  # fmt: skip
        owned = [_shard_count(server.url, s) for s in shards]
        assert sum(owned) == 30 and all(owned), owned
    finally:
        for daemon in daemons:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.terminate()
        server.stop()


def _shard_query(url: str, shard: ShardId, sql: str) -> QueryResult | None:
    async def ask() -> QueryResult | None:
        nc = await nats.connect(url)
        try:
            reply = await nc.request(shard.query_subject, msgspec.msgpack.encode(QueryRequest(sql=sql)), timeout=5)
            return msgspec.msgpack.decode(reply.data, type=QueryResult)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return None
        finally:
            await nc.close()

    return asyncio.run(ask())


def _shard_answers(url: str, shard: ShardId) -> bool:
    return _shard_query(url, shard, "select 1") is not None


def _shard_count(url: str, shard: ShardId) -> int:
    result = _shard_query(url, shard, "select count(*) from steps")
    assert result is not None and not result.error, result
    return int(result.rows[0][0])


# ---- a bad namespace ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "env"), [(["--namespace", "a.b"], {}), ([], {"VIGIL_NAMESPACE": "-x"})])
def test_a_bad_namespace_stops_vigil_up_in_one_line(tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
    up = vigil("up", "--data-dir", str(tmp_path), "--http-port", "0", *args, env={**os.environ, **env},
               timeout=DEADLINE_S)  # fmt: skip
    assert up.returncode == EXIT_USAGE, up.stderr
    lines = up.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vigil: configuration error:"), up.stderr
    assert "namespace (VIGIL_NAMESPACE, --namespace) must be empty, or 1-32 letters" in lines[0]
    assert not (tmp_path / "vigil.duckdb").exists()


def test_a_bad_namespace_stops_trainvigil_init(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"namespace .* must be empty, or 1-32") as said:
        trainvigil.init(run_id="r", namespace="a b")
    assert said.value.key == "namespace"
    monkeypatch.setenv("VIGIL_NAMESPACE", "x" * 33)
    with pytest.raises(ConfigError, match="namespace"):
        trainvigil.init(run_id="r")
