"""``vigil canary run``: fault-injection canaries on demand, and their verdicts (``vigil canary list`` lists them).

``run`` asks the running daemon (``--nats``, else the configuration's broker) to run the canaries,
so they go through the same broker, detectors, store and alerts as the real runs it watches, and
their verdicts land in its history. The trigger (``vigil.v1.ctl.canary``) starts processes on the
daemon's machine, so with auth on it takes the *daemon's* credentials (``--creds``; on that machine
``DATA_DIR/bus/daemon.toml`` is found by itself); a reader's are refused. When no daemon answers,
``run`` starts one in this process on ``--data-dir`` (with the bundled broker unless one answers)
for as long as the canaries take, and says so. Against a sharded deployment (``vigil up --shard I/N``)
each canary runs on the shard that owns its run (whichever shard the trigger reaches hands it on), and
the progress lines ask that shard.

While they run: a line per canary accepted, its step every ``PROGRESS_S`` seconds, each alert
update on its run, and its verdict; at the end a table (or JSON lines) of the verdicts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from trainvigil.daemon.cli._config import command_config
from trainvigil.daemon.cli._exits import EXIT_OK, EXIT_QUERY
from trainvigil.schemas.canaries import CLEAN, FAULT_KINDS
from trainvigil.schemas.redact import redact_url
from trainvigil.schemas.settings import did_you_mean
from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, Subjects

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from trainvigil.daemon.cli.sqlclient import _Connection
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.schemas import CanaryResult
    from trainvigil.schemas.canaries import CanaryAccepted, CanaryRequest

EXIT_PASS, EXIT_FAIL = EXIT_OK, EXIT_QUERY
PROGRESS_S = 10.0
"""Seconds between progress lines (and between the checks that the daemon still answers)."""
SILENT_POLLS = 3
"""Progress checks in a row the daemon may miss before the run gives up on it (exit 3)."""

RESULT_COLUMNS = (
    "run_id", "workload", "fault", "verdict", "expected", "fired", "fault_step", "fired_step", "latency_steps",
    "latency_s", "duration_s",
)  # fmt: skip


def check_fault(fault: str | None) -> None:
    """``--fault``, before anything starts: a kind of :data:`FAULT_KINDS`, or :data:`CLEAN`.

    Raises:
        ConfigError: an unknown kind; the message names the closest one.
    """
    from trainvigil.errors import ConfigError

    kinds = (*FAULT_KINDS, CLEAN)
    if fault is not None and fault not in kinds:
        raise ConfigError(
            f"unknown fault {fault!r}{did_you_mean(fault, kinds)} (kinds: {', '.join(FAULT_KINDS)}, or {CLEAN}: "
            "a clean twin)",
            key="fault",
        )


def check_plans(config: DaemonConfig, asks: list[CanaryRequest]) -> None:
    """Before a daemon is started here for ``asks``: what it would refuse, refused now (nothing has started).

    ``config`` is that daemon's, so its workloads and ``[[canary.jobs]]`` are the whole set. A daemon
    that already answers is not checked against: it may run jobs of a configuration this command lacks.

    Raises:
        ConfigError: an unknown workload (the message names the closest one), a fault it does not take,
            ``--steps`` for a job with its own command line, a fault step past the run's steps.
    """
    from trainvigil.daemon.canary.catalog import CanaryPlanError, jobs, plan
    from trainvigil.errors import ConfigError

    known = jobs(config.canary)
    for ask in asks:
        if ask.workload and ask.workload not in known:
            raise ConfigError(
                f"unknown workload {ask.workload!r}{did_you_mean(ask.workload, known)} (workloads: "
                f"{', '.join(known)}; a [[canary.jobs]] name needs the --config that defines it)",
                key="workload",
            )
        try:
            plan(config, f"canary-{ask.id}", ask.fault, ask.workload, ask.steps, ask.fault_step)
        except CanaryPlanError as exc:
            raise ConfigError(str(exc), key="fault") from None


def requests(args: argparse.Namespace, config: DaemonConfig) -> list[CanaryRequest]:
    """What ``run`` asks for: one canary, or (``--all``) one per fault kind the workload(s) take and a clean twin."""
    from trainvigil.daemon.canary.catalog import jobs
    from trainvigil.daemon.canary.schedule import new_id
    from trainvigil.schemas.canaries import CanaryRequest

    def ask(fault: str, workload: str = "") -> CanaryRequest:
        return CanaryRequest(id=new_id(), fault=fault, workload=workload, steps=args.steps, fault_step=args.fault_step)

    if not args.all:
        return [ask(args.fault, args.workload or "")]
    if not args.workload:
        return [ask(fault) for fault in FAULT_KINDS] + [ask(CLEAN)]
    known = jobs(config.canary).get(args.workload)
    kinds = known.faults if known is not None else FAULT_KINDS  # the daemon's own jobs: it says what they take
    return [ask(fault, args.workload) for fault in kinds] + [ask(CLEAN, args.workload)]


def _say(text: str) -> None:
    from trainvigil.daemon.formatting import terminal_safe

    # Verdicts and alerts name runs and detectors as the bus carried them: shown as text.
    print(f"vigil: {terminal_safe(text)}", file=sys.stderr, flush=True)


class _Follower:
    """The canaries of one ``run``: what was accepted, what their runs raised, their verdicts."""

    def __init__(self, subjects: Subjects = DEFAULT_SUBJECTS) -> None:
        import anyio

        self.subjects = subjects
        """The namespace's subjects the canaries are asked for and followed on."""
        self.accepted: dict[str, CanaryAccepted] = {}
        self.results: dict[str, CanaryResult] = {}
        self.steps: dict[str, int] = {}
        self.shards: int | None = None
        """The shard count once the progress question found a sharded deployment (no daemon answers SQL alone)."""
        self.changed = anyio.Event()

    async def on_message(self, msg: Any) -> None:
        from trainvigil.errors import WireError
        from trainvigil.schemas import Anomaly, CanaryResult, decode

        try:
            records = decode(msg.data).records
        except WireError:
            return
        for record in records:
            if isinstance(record, CanaryResult) and record.name in self.accepted:
                self.results[record.name] = record
                _say(f"{record.name}: {record.verdict}: {record.detail}")
                self.changed.set()
            elif isinstance(record, Anomaly) and record.run_id in self.accepted and record.detector != "canary_failed":
                where = f"step {record.step}" if record.step is not None else "no step"
                _say(f"{record.run_id}: {record.detector} {record.severity} {record.state} at {where}")

    @property
    def pending(self) -> list[str]:
        return [run_id for run_id in self.accepted if run_id not in self.results]


async def _steps_of(nc: NATS, subject: str, run_ids: list[str]) -> list[list[Any]]:
    """The last step stored of each of ``run_ids``, asked on ``subject`` (a daemon's or a shard's query subject)."""
    import msgspec

    from trainvigil.schemas.query import QueryRequest, QueryResult

    ids = ", ".join("'" + run_id.replace("'", "''") + "'" for run_id in run_ids)
    sql = f"SELECT run_id, max(step) FROM steps WHERE run_id IN ({ids}) GROUP BY run_id"
    reply = await nc.request(subject, msgspec.msgpack.encode(QueryRequest(sql=sql)), timeout=10)
    return msgspec.msgpack.decode(reply.data, type=QueryResult).rows


async def _last_steps(nc: NATS, follower: _Follower, pending: list[str]) -> list[list[Any]]:
    """``_steps_of`` the daemon, or, on a sharded deployment, of each run's shard (it alone holds the run)."""
    import nats.errors

    from trainvigil.daemon.cli.shardsql import roll_call
    from trainvigil.schemas.shards import ShardId, shard_of

    subjects = follower.subjects
    if follower.shards is None:
        try:
            return await _steps_of(nc, subjects.query, pending)
        except nats.errors.NoRespondersError:
            called = await roll_call(nc, subjects=subjects)
            if called is None:
                raise
            follower.shards = called[0]
    count = follower.shards
    owners: dict[int, list[str]] = {}
    for run_id in pending:
        owners.setdefault(shard_of(run_id, count), []).append(run_id)
    rows: list[list[Any]] = []
    for index, run_ids in owners.items():
        rows += await _steps_of(nc, ShardId(index, count, subjects).query_subject, run_ids)
    return rows


async def _progress(nc: NATS, follower: _Follower) -> bool:
    """One progress line; ``False`` when the daemon (or a shard holding a pending run) did not answer the question."""
    import msgspec
    import nats.errors

    from trainvigil.errors import QueryError

    pending = follower.pending
    try:
        rows = await _last_steps(nc, follower, pending)
    except (nats.errors.Error, TimeoutError, msgspec.MsgspecError, QueryError):
        return False
    follower.steps.update({str(run_id): int(step) for run_id, step in rows})
    running = [f"{r} step {follower.steps[r]}" for r in pending if r in follower.steps]
    waiting = len(pending) - len(running)
    queued = f", {waiting} queued or starting" if waiting else ""
    _say(f"{len(follower.results)}/{len(follower.accepted)} judged{queued}" + "".join(f"; {r}" for r in running))
    return True


async def drive(nc: NATS, url: str, asks: list[CanaryRequest], subjects: Subjects) -> list[CanaryResult]:
    """Ask the daemon of ``subjects``' namespace on ``nc`` for every canary in ``asks``, follow them, and return
    their verdicts.

    Raises:
        ConfigError: the daemon refused a canary (an unknown fault or workload).
        DaemonUnavailableError: the daemon stopped answering before every verdict came.
    """
    import anyio
    import msgspec

    from trainvigil.errors import ConfigError, DaemonUnavailableError
    from trainvigil.schemas.canaries import CanaryAccepted

    follower = _Follower(subjects)
    for ask in asks:
        run_id = f"canary-{ask.id}"
        await nc.subscribe(subjects.alert(run_id), cb=follower.on_message)
        reply = await nc.request(subjects.canary, msgspec.msgpack.encode(ask), timeout=10)
        accepted = msgspec.msgpack.decode(reply.data, type=CanaryAccepted)
        if accepted.error:
            raise ConfigError(f"the daemon at {redact_url(url)} refused the canary: {accepted.error}", key="fault")
        follower.accepted[accepted.run_id] = accepted
        what = "clean twin" if accepted.fault == CLEAN else f"{accepted.fault}@{accepted.fault_step}"
        expects = f", expects {accepted.expected_detector}" if accepted.expected_detector else ""
        _say(f"{accepted.run_id}: {accepted.workload} {what}{expects}: queued")
    missed = 0
    while follower.pending:
        follower.changed = anyio.Event()
        with anyio.move_on_after(PROGRESS_S):
            await follower.changed.wait()
        if follower.pending:
            missed = 0 if await _progress(nc, follower) else missed + 1
        if missed >= SILENT_POLLS:
            raise DaemonUnavailableError(
                f"the daemon at {redact_url(url)} stopped answering with {len(follower.pending)} canaries unjudged; "
                "their verdicts, if any, show in vigil canary list"
            )
    return [follower.results[run_id] for run_id in follower.accepted]


def _row(r: CanaryResult) -> list[Any]:
    lat = None if r.latency_s is None else round(r.latency_s, 2)
    duration = None if r.duration_s is None else round(r.duration_s, 1)
    return [r.name, r.workload, r.fault, r.verdict, r.expected_detector, r.fired_detector, r.fault_step,
            r.fired_step, r.latency_steps, lat, duration]  # fmt: skip


def report(results: list[CanaryResult], fmt: str) -> str:
    """The verdicts as a table or JSON lines."""
    from trainvigil.daemon.formatting import render
    from trainvigil.schemas.query import QueryResult

    if fmt == "json":
        import msgspec

        return "".join(json.dumps(msgspec.to_builtins(r)) + "\n" for r in results)
    return render(QueryResult(columns=list(RESULT_COLUMNS), rows=[_row(r) for r in results]), "table")


async def _daemon_answers(conn: _Connection, url: str, subjects: Subjects) -> bool:
    """Whether a daemon listens for canary triggers on ``conn`` (an empty request: it answers with an error).

    Raises:
        ConfigError: these credentials may not send triggers (a reader's or an agent's).
    """
    import nats.errors

    from trainvigil.errors import ConfigError

    assert conn.nc is not None
    try:
        await conn.nc.request(subjects.canary, b"", timeout=5)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        if any("permissions violation" in str(e).lower() for e in conn.errors):
            raise ConfigError(
                f"the broker at {redact_url(url)} does not let these credentials trigger canaries (they start "
                "processes on the daemon's machine): pass the daemon's credentials with --creds",
                key="nats_creds",
            ) from None
        return False
    return True


def run(args: argparse.Namespace) -> int:
    """``vigil canary run`` (see the module's docstring); the exit status."""
    import anyio

    from trainvigil.daemon.cli._with_daemon import with_daemon

    check_fault(args.fault)  # before the configuration is even read: a typo needs nothing else to be refused
    cfg = command_config(args)
    asks = requests(args, cfg)
    started = time.monotonic()

    async def work(conn: _Connection, url: str) -> list[CanaryResult]:
        assert conn.nc is not None
        return await drive(conn.nc, url, asks, cfg.subjects)

    interrupted = "interrupted before every canary was judged; see vigil canary list"
    results = anyio.run(
        partial(
            with_daemon,
            cfg,
            "daemon",
            work,
            _daemon_answers,
            interrupted=interrupted,
            before_start=partial(check_plans, cfg, asks),
        ),
        backend="asyncio",
    )
    sys.stdout.write(report(results, args.format))
    passed = sum(r.verdict == "pass" for r in results)
    _say(f"{passed} of {len(results)} canaries passed in {time.monotonic() - started:.0f} s")
    return EXIT_PASS if passed == len(results) else EXIT_FAIL
