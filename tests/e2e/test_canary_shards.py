"""Canaries on a sharded deployment: each shard runs the canaries whose runs it owns, and ``vigil canary run``,
``vigil canary list`` and ``vigil report`` work against the shards as against one daemon.

A real 3-node NATS cluster mapping runs over two shards (``bench/_cluster.py``), two real daemons
(``vigil up --shard I/2``) with a short schedule of a tiny clean job, real canary processes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
import support
from support import AuthBroker, ShardDaemon, wait_for

from trainvigil.daemon.canary.schedule import owned_id, run_id_of
from trainvigil.daemon.cli.canary import _Follower, _progress
from trainvigil.daemon.cli.sqlclient import QuerySource
from trainvigil.schemas import DEFAULT_SUBJECTS, CanaryResult, decode
from trainvigil.schemas.canaries import CanaryAccepted, CanaryRequest
from trainvigil.schemas.credentials import ANONYMOUS, BusAccess
from trainvigil.schemas.shards import ShardId, shard_of
from trainvigil.testing import NatsCluster

pytestmark = pytest.mark.xdist_group("canary_shards")  # with --dist loadgroup: one worker builds the deployment
SHARDS = 2
TINY = """\
import sys
import trainvigil

agent = trainvigil.init()
for step in range(20):
    agent.log(step, loss=1.0 / (step + 1))
sys.exit(0 if agent.close(timeout=30) else 1)
"""
"""The scheduled job: a clean agent run of 20 steps, no torch (the machine is shared)."""

vigil = functools.partial(support.vigil, timeout=240)


class Deployment:
    """The broker cluster and its shards."""

    def __init__(self, cluster: NatsCluster, shards: list[ShardDaemon]) -> None:
        self.cluster, self.shards = cluster, shards

    @property
    def url(self) -> str:
        return self.cluster.url

    def across(self, sql: str) -> list[list[Any]]:
        """``sql`` answered across every shard (as ``vigil sql`` does), no shard missing."""
        with QuerySource(nats_url=self.url, data_dir="/nonexistent", timeout=30) as source:
            result = source.ask(sql, 100_000)
            assert not source.missing, source.warning
            return result.rows


def _config(root: Path, canary: str) -> Path:
    """A daemon configuration: ``[canary]`` with these lines and the ``tiny`` job (written beside it)."""
    (root / "tiny.py").write_text(TINY)
    config = root / "vigil.toml"
    config.write_text(
        f"[canary]\n{canary}\nworkloads = []\nlinger_s = 1.0\nsettle_s = 20.0\n"
        f'[[canary.jobs]]\nname = "tiny"\ncommand = "{sys.executable} {root / "tiny.py"}"\n'
    )
    return config


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("canary-shards")
    config = _config(root, 'enabled = true\nevery = "10s"\nfault_probability = 0.0')
    cluster = NatsCluster(root / "nats", nodes=3, shards=SHARDS)
    cluster.start()
    env = {"VIGIL_STREAM_MAX_BYTES": str(2**30)}  # far below a default stream's reservation on each node
    shards = [ShardDaemon(cluster.url, root / f"s{i}", ShardId(i, SHARDS), env=env) for i in range(SHARDS)]
    try:
        for d in shards:
            d.extra = (*d.extra, "--config", str(config))
            d.launch()
        for d in shards:
            d.wait_ready()
        yield Deployment(cluster, shards)
        running = [d for d in shards if d.process is not None and d.process.poll() is None]
        assert support.terminate_together(*running) == [0] * len(running)
    finally:
        for d in shards:
            if d.process is not None and d.process.poll() is None:
                d.kill()
        cluster.stop()


def _judged(shard: ShardDaemon) -> list[list[Any]]:
    return shard.sql("select name, verdict from canary_results order by time").rows


def test_a_shard_draws_run_ids_it_owns_and_an_unsharded_daemon_any() -> None:
    for count in (1, 2, 5):
        for index in range(count):
            shard = ShardId(index, count)
            assert all(shard.owns(run_id_of(owned_id(shard))) for _ in range(20))
            assert all(shard.owner_of(run_id_of(owned_id(shard))) == shard for _ in range(5))
    assert len({owned_id(None) for _ in range(50)}) == 50


@pytest.mark.slow
def test_each_shard_runs_scheduled_canaries_whose_runs_land_in_its_own_history(deployment: Deployment) -> None:
    for shard in deployment.shards:
        wait_for(functools.partial(_judged, shard), 90, f"a scheduled canary judged on shard {shard.shard}")
    for shard in deployment.shards:
        judged = _judged(shard)
        assert all(shard_of(name, SHARDS) == shard.shard.index for name, _ in judged), judged
        assert {verdict for _, verdict in judged} == {"pass"}, judged
        # The run's steps came through the broker's mapping to this shard's stream: its own history.
        stored = shard.sql("select run_id, count(*) from steps where run_id like 'canary-%' group by 1").rows
        assert {name for name, _ in judged} <= {run for run, n in stored if n == 20}, stored
    merged = deployment.across("select count(*) from canary_results")
    assert merged[0][0] >= len(deployment.shards)


@pytest.mark.slow
def test_vigil_canary_run_against_the_shards_catches_nan_grad_on_the_shard_that_owns_its_run(
    deployment: Deployment,
) -> None:
    done = vigil("canary", "run", "--fault", "nan_grad", "--steps", "20000", "--fault-step", "100",
                 "--nats", deployment.url, "--format", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no daemon answered" not in done.stderr
    result = json.loads(done.stdout)
    assert (result["fault"], result["verdict"], result["fired_detector"]) == ("nan_grad", "pass", "non_finite")
    owner = deployment.shards[shard_of(result["name"], SHARDS)]
    assert owner.sql(f"select verdict from canary_results where name = '{result['name']}'").rows == [["pass"]]
    listed = vigil("canary", "list", "--nats", deployment.url, "--last", "100000", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert result["name"] in {json.loads(line)["run_id"] for line in listed.stdout.splitlines()}


async def _trigger(
    url: str, ids: list[str], access: BusAccess = ANONYMOUS
) -> tuple[list[CanaryAccepted], dict[str, CanaryResult]]:
    """Ask for a clean ``tiny`` canary per id on the general trigger subject; every answer, and each verdict
    as published on its run's alert subject."""
    nc = await nats.connect(url.split(","), **access.connect_options())
    results: dict[str, CanaryResult] = {}
    done = asyncio.Event()

    async def on_result(msg: Any) -> None:
        for record in decode(msg.data).records:
            if isinstance(record, CanaryResult):
                results[record.name] = record
        if len(results) == len(ids):
            done.set()

    try:
        for i in ids:
            await nc.subscribe(DEFAULT_SUBJECTS.alert(run_id_of(i)), cb=on_result)
        answers = []
        for i in ids:
            ask = msgspec.msgpack.encode(CanaryRequest(id=i, workload="tiny"))
            reply = await nc.request(DEFAULT_SUBJECTS.canary, ask, timeout=10)
            answers.append(msgspec.msgpack.decode(reply.data, type=CanaryAccepted))
        if all(not a.error for a in answers):
            await asyncio.wait_for(done.wait(), 120)
        return answers, results
    finally:
        await nc.close()


def _ids_of(index: int, n: int) -> list[str]:
    """``n`` new canary ids whose runs shard ``index`` owns."""
    return [owned_id(ShardId(index, SHARDS)) for _ in range(n)]


@pytest.mark.slow
def test_a_trigger_is_run_by_the_shard_that_owns_its_run_whichever_shard_it_reached(deployment: Deployment) -> None:
    """The broker hands a trigger to either shard; each canary still runs, and is stored, on its run's owner."""
    ids = _ids_of(0, 2) + _ids_of(1, 2)
    answers, results = asyncio.run(_trigger(deployment.url, ids))
    assert [a.error for a in answers] == [""] * len(ids)
    assert [a.run_id for a in answers] == [run_id_of(i) for i in ids]
    assert {name: r.verdict for name, r in results.items()} == {run_id_of(i): "pass" for i in ids}
    for shard in deployment.shards:
        mine = {run_id_of(i) for i in ids if shard_of(run_id_of(i), SHARDS) == shard.shard.index}
        assert mine <= {name for name, _ in _judged(shard)}
        other = deployment.shards[1 - shard.shard.index]
        assert not mine & {name for name, _ in _judged(other)}


@pytest.mark.slow
def test_vigil_report_counts_the_canaries_of_every_shard(deployment: Deployment) -> None:
    wait_for(lambda: all(_judged(s) for s in deployment.shards), 90, "a canary judged on every shard")
    each = [len(_judged(s)) for s in deployment.shards]  # the schedule goes on: counts only grow
    done = vigil("report", "--nats", deployment.url, "--format", "json")
    after = deployment.across("select count(*) from canary_results")[0][0]
    assert done.returncode == 0, done.stderr
    canaries = json.loads(done.stdout)["canaries"]
    assert sum(each) <= canaries["run"] <= after, (each, canaries)
    assert (canaries["errored"], canaries["failed"]) == (0, 0), canaries


@pytest.mark.slow
def test_canary_run_progress_reads_each_runs_last_step_from_the_shard_that_holds_it(deployment: Deployment) -> None:
    """No daemon answers SQL alone on a sharded deployment: ``vigil canary run``'s progress asks each run's shard."""
    wait_for(lambda: all(_judged(s) for s in deployment.shards), 90, "a canary judged on every shard")
    names = [_judged(s)[0][0] for s in deployment.shards]

    async def ask() -> tuple[bool, dict[str, int]]:
        nc = await nats.connect(deployment.url.split(","))
        try:
            follower = _Follower()
            follower.accepted = {name: CanaryAccepted(run_id=name) for name in names}
            return await _progress(nc, follower), follower.steps
        finally:
            await nc.close()

    assert asyncio.run(ask()) == (True, {name: 19 for name in names})


@pytest.mark.slow
def test_a_trigger_for_a_run_of_a_shard_that_is_down_says_which_shard_to_start(deployment: Deployment) -> None:
    """Last in the module: it stops shard 1. Shard 0 takes every trigger then, and names the owner it cannot reach."""
    down = deployment.shards[1]
    assert down.terminate() == 0
    (orphan,) = _ids_of(1, 1)
    answers, _ = asyncio.run(_trigger(deployment.url, [orphan]))
    (answer,) = answers
    assert "shard 1/2" in answer.error and "vigil up --shard 1/2" in answer.error, answer.error
    assert run_id_of(orphan) not in {name for name, _ in _judged(deployment.shards[0])}


@pytest.mark.slow
def test_on_a_bus_with_users_a_trigger_handed_on_between_shards_is_answered_and_run(tmp_path: Path) -> None:
    """``vigil auth --shards 2``: a shard hands a trigger on from its own (daemon's) inbox, which the owner answers;
    a reader may not send triggers, on the shared subject or a shard's own."""
    broker = AuthBroker(tmp_path, "--shards", str(SHARDS))
    broker.start()
    env = {"VIGIL_NATS_CREDS": str(broker.creds("daemon")), "VIGIL_CANARY_AGENT_CREDS": str(broker.creds("agent"))}
    shards = [ShardDaemon(broker.url, tmp_path / f"s{i}", ShardId(i, SHARDS), env=env) for i in range(SHARDS)]
    try:
        for d in shards:
            # Two slots: each shard runs its two canaries side by side.
            d.extra = (*d.extra, "--config", str(_config(tmp_path, "enabled = false\nconcurrency = 2")))
            d.launch()
        for d in shards:
            d.wait_ready()
        ids = _ids_of(0, 2) + _ids_of(1, 2)
        answers, results = asyncio.run(_trigger(broker.url, ids, BusAccess(creds=str(broker.creds("daemon")))))
        assert [a.error for a in answers] == [""] * len(ids)
        assert {name: r.verdict for name, r in results.items()} == {run_id_of(i): "pass" for i in ids}
        for shard in shards:
            mine = {run_id_of(i) for i in ids if shard_of(run_id_of(i), SHARDS) == shard.shard.index}
            assert {name for name, _ in _judged(shard)} == mine
        reader = BusAccess(creds=str(broker.creds("reader")))
        for subject in (DEFAULT_SUBJECTS.canary, ShardId(1, SHARDS).canary_subject):
            with pytest.raises(nats.errors.Error):
                asyncio.run(_ask_once(broker.url, subject, reader))
        assert support.terminate_together(*shards) == [0] * SHARDS
    finally:
        for d in shards:
            if d.process is not None and d.process.poll() is None:
                d.kill()
        broker.stop()


async def _ask_once(url: str, subject: str, access: BusAccess) -> bytes:
    nc = await nats.connect(url, **access.connect_options())
    try:
        ask = msgspec.msgpack.encode(CanaryRequest(id=owned_id(ShardId(1, SHARDS)), workload="tiny"))
        return (await nc.request(subject, ask, timeout=3)).data
    finally:
        await nc.close()
