"""The daemon's canary stage: the schedule, the ``vigil canary run`` trigger, and at most ``concurrency`` jobs.

It runs beside ingest in the daemon's task group and shares nothing with it but the store's
writer lock for one short transaction per verdict: a canary never blocks ingest. Jobs run in a
task group of their own; cancelling the stage (daemon shutdown) kills every job's process group
and records it ``aborted``, a trigger still waiting for a slot included.

Slots: a scheduled tick that finds every slot taken is skipped (logged ``canary_skipped``), never
queued, so slow canaries cannot pile up; a triggered canary waits for its slot.

On a shard (``vigil up --shard I/N``) every canary runs on the shard that owns its run id, because only
that shard's stream gets the run's records and only its detectors see them: the schedule draws ids the
shard owns (:func:`~.schedule.owned_id`), so each shard proves its own detectors. A trigger reaches one
shard of the queue group at random; one for a run another shard owns is handed on to that shard's own
subject (:attr:`~trainvigil.schemas.shards.ShardId.canary_subject`) and its answer passed back, and an
owner that does not answer is named in the answer. A trigger on a shard's own subject is never handed on.
"""

from __future__ import annotations

import contextlib
import random
import time
from itertools import count

import anyio
import msgspec
import nats.errors
import structlog
from anyio.abc import TaskGroup, TaskStatus
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from trainvigil.daemon.alerts.fanout import Alerts
from trainvigil.daemon.broker.replies import Replies
from trainvigil.daemon.canary import evidence as ev
from trainvigil.daemon.canary.catalog import CanaryPlanError, Plan, jobs, plan
from trainvigil.daemon.canary.runner import Runner
from trainvigil.daemon.canary.schedule import Every, draw, owned_id, run_id_of, scheduled_jobs
from trainvigil.daemon.canary.verdict import Ending, Evidence
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.daemon.store.writer import Store
from trainvigil.schemas.canaries import CanaryAccepted, CanaryRequest
from trainvigil.schemas.shards import ShardId

log = structlog.get_logger("trainvigil.canary")
_request_decoder = msgspec.msgpack.Decoder(CanaryRequest)
_encoder = msgspec.msgpack.Encoder()

HAND_ON_S = 5.0
"""How long a shard waits for the owner of a trigger's run to answer it (``vigil canary run`` waits 10 s)."""


class Canaries:
    """The canary stage of one daemon (see the module's docstring)."""

    def __init__(
        self, nc: NATS, store: Store, config: DaemonConfig, metrics: DaemonMetrics, alerts: Alerts, nats_url: str
    ) -> None:
        self.nc, self.config = nc, config
        self.shard = config.shard_id
        self.subject = config.subjects.canary
        """Where every daemon of the namespace (every shard) takes triggers."""
        self.runner = Runner(nc, store, config, metrics, alerts, nats_url)
        self.slots = anyio.Semaphore(config.canary.concurrency)
        self.active: set[str] = set()
        self.rng = random.Random()

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Answer triggers and, when ``canary.enabled``, run the schedule; until cancelled."""
        cfg = self.config.canary
        for fault, at, passed in await self.runner.read(ev.latest_verdicts):  # /metrics survives a restart
            self.runner.metrics.canary_last[fault] = (at, passed)
        subs = [await self.nc.subscribe(self.subject, queue="vigil-canary")]
        if self.shard is not None:
            subs.append(await self.nc.subscribe(self.shard.canary_subject, queue="vigil-canary"))
        try:
            async with anyio.create_task_group() as tg:
                for sub in subs:
                    tg.start_soon(self._answer, sub, tg)
                if cfg.enabled:
                    tg.start_soon(self._schedule, tg)
                log.info("canaries_ready", shard=str(self.shard) if self.shard else None, scheduled=cfg.enabled,
                         every=cfg.every, concurrency=cfg.concurrency,
                         jobs=[j.name for j in scheduled_jobs(cfg, jobs(cfg))] if cfg.enabled else [])  # fmt: skip
                task_status.started()
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(nats.errors.Error):
                for sub in subs:
                    await sub.unsubscribe()

    async def _schedule(self, tg: TaskGroup) -> None:
        cfg = self.config.canary
        every = Every(cfg.every, time.time())
        turns = scheduled_jobs(cfg, jobs(cfg))
        if not turns:
            log.warning("canary_schedule_empty", note="canary.enabled but no workloads and no jobs: nothing to run")
            return
        for turn in count():
            await anyio.sleep(max(0.0, every.next_after(time.time()) - time.time()))
            job = turns[turn % len(turns)]
            try:
                self.slots.acquire_nowait()
            except anyio.WouldBlock:
                log.info("canary_skipped", job=job.name, why=f"all {cfg.concurrency} slots busy (canary.concurrency)")
                continue
            chosen = plan(self.config, run_id_of(owned_id(self.shard)), draw(job, cfg, self.rng), job.name)
            tg.start_soon(self._run, chosen, True)

    async def _run(self, chosen: Plan, holding: bool = False) -> None:
        """Run ``chosen`` in a slot (``holding``: the caller already took it)."""
        self.active.add(chosen.run_id)
        try:
            if not holding:
                try:
                    await self.slots.acquire()
                except anyio.get_cancelled_exc_class():
                    with anyio.CancelScope(shield=True):
                        log_path = self.runner.log_dir / f"{chosen.run_id}.log"
                        waiting = Ending(None, aborted=True, last_line="it never started (it waited for a slot)")
                        await self.runner.record(chosen, waiting, Evidence(), 0.0, log_path)
                    raise
            try:
                await self.runner.run(chosen)
            except Exception:  # a canary never takes the daemon down
                log.exception("canary_runner_failed", run_id=chosen.run_id)
            finally:
                self.slots.release()
        finally:
            self.active.discard(chosen.run_id)

    async def _answer(self, sub: Subscription, tg: TaskGroup) -> None:
        replies = Replies(self.nc, self.runner.metrics, "canary")
        async for msg in sub.messages:
            if replies.asker(msg.reply) is None:  # a trigger whose answer could go elsewhere starts nothing
                continue
            if (owner := self._owner_elsewhere(msg)) is not None:
                tg.start_soon(self._hand_on, msg, owner)
                continue
            try:
                accepted, chosen = await self._accept(msg)
            except Exception as exc:  # one bad trigger never takes the daemon down, and still gets an answer
                log.exception("canary_trigger_failed", error=repr(exc))
                accepted, chosen = CanaryAccepted(error=f"the daemon failed to take the canary ({exc!r})"), None
            with contextlib.suppress(nats.errors.Error):
                await self.nc.publish(msg.reply, _encoder.encode(accepted))
            if chosen is not None:
                tg.start_soon(self._run, chosen)

    def _owner_elsewhere(self, msg: Msg) -> ShardId | None:
        """The shard to hand a trigger on to: the owner of its run when that is another shard and the trigger came on
        the subject every shard shares; ``None`` to answer it here (unsharded, owned here, or not a request at all)."""
        if self.shard is None or msg.subject != self.subject:
            return None
        try:
            run_id = run_id_of(_request_decoder.decode(msg.data).id)
        except msgspec.MsgspecError:
            return None
        return None if self.shard.owns(run_id) else self.shard.owner_of(run_id)

    async def _hand_on(self, msg: Msg, owner: ShardId) -> None:
        """Ask ``owner`` to take the trigger ``msg`` and pass its answer back to the asker."""
        try:
            answer = (await self.nc.request(owner.canary_subject, msg.data, timeout=HAND_ON_S)).data
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            run_id = run_id_of(_request_decoder.decode(msg.data).id)
            error = (
                f"the run {run_id} belongs to shard {owner}, which does not answer canary triggers: start it "
                f"(vigil up --shard {owner}) and ask again"
            )
            log.warning("canary_owner_silent", run_id=run_id, owner=str(owner))
            answer = _encoder.encode(CanaryAccepted(error=error))
        except nats.errors.Error as exc:  # closed on shutdown: the asker hears nothing and says so
            log.debug("canary_hand_on_failed", owner=str(owner), error=repr(exc))
            return
        with contextlib.suppress(nats.errors.Error):
            await self.nc.publish(msg.reply, answer)

    async def _accept(self, msg: Msg) -> tuple[CanaryAccepted, Plan | None]:
        """What a trigger asks for, decided: the plan and its answer, or the answer saying why not."""
        try:
            request = _request_decoder.decode(msg.data)
            run_id = run_id_of(request.id)
            if self.shard is not None and not self.shard.owns(run_id):
                raise CanaryPlanError(
                    f"the run {run_id} belongs to shard {self.shard.owner_of(run_id)}, not {self.shard}: "
                    f"send the trigger to {self.subject}"
                )
            if run_id in self.active or await self.runner.read(ev.known_run, run_id):
                raise CanaryPlanError(f"the run id {run_id} is taken; send another id")
            chosen = plan(self.config, run_id, request.fault, request.workload, request.steps, request.fault_step)
        except (msgspec.MsgspecError, CanaryPlanError) as exc:
            if msg.data:  # an empty request is a client asking whether a daemon is here
                log.info("canary_refused", error=str(exc))
            return CanaryAccepted(error=str(exc)), None
        self.active.add(run_id)  # taken from now on: a second request for it is refused
        log.info("canary_requested", canary=chosen.describe())
        answer = CanaryAccepted(
            run_id=chosen.run_id,
            workload=chosen.job.name,
            fault=chosen.fault,
            fault_step=chosen.fault_step,
            expected_detector=chosen.expected,
        )
        return answer, chosen
