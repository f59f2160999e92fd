"""A fleet of training ranks on the wire, without agents: many (run, rank) streams, each sending
one message per ``interval`` with the steps logged since the last one, as an agent's interval
flush sends them. Shared by ``ingest.py --fleet`` and ``tests/unit/test_fleet.py``.

Messages are what an agent publishes: an :class:`~trainvigil.schemas.Envelope` from the rank's
:class:`~trainvigil.schemas.Source` holding one ``StepBatch`` equal to what the agent's own
``build_step_batch`` makes of the same steps, published through JetStream with a ``Nats-Msg-Id``
and resent with the same id until acknowledged. Every rank sends a ``RunStart`` first and a
``RunEnd`` last. Ranks are spread over producer processes (one NATS connection each); within an
interval each rank publishes at its own phase, so the load is even. Step ``j`` of a message is
stamped with its ``log()`` time: the send time minus the later steps' share of the interval.

Two faults, known to every process from the spec alone: one straggler rank reports
``straggler_factor`` times the step time from ``straggler_at`` seconds on (ranks run in lockstep,
so it keeps the others' step numbers), and every ``nan_every`` seconds from ``nan_from`` on
another rank logs a NaN loss on the last step of one message (each injection on a rank of its
own, so each opens an episode of its own). Producers report what they injected; an
:class:`AlertWatch` records alerts as they arrive, and :func:`straggler_verdict` and
:func:`nan_latencies` match the two.

Run as a process: ``python bench/fleet.py INDEX NATS_URL SPEC_JSON`` connects, sends the
``RunStart`` of its ranks, prints ``ready``, waits for ``go T0`` on stdin (``T0``: the shared
Unix start time), publishes until ``T0 + seconds``, delivers the rest, prints a JSON report.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from trainvigil.schemas import (
    DEFAULT_SUBJECTS,
    Anomaly,
    Column,
    Envelope,
    RunEnd,
    RunStart,
    Source,
    StepBatch,
    decode,
    encode,
)

ALERTS = "vigil.v1.alerts.>"
_GOLDEN = (math.sqrt(5) - 1) / 2
_F8 = np.dtype("<f8")
_I8 = np.dtype("<i8")
TICK_S = 0.02
"""A producer wakes at most this often and sends every message due by then: one socket write for all of
them, as many connections' messages reach a real broker together (a message is stamped with its due time)."""


@dataclass(frozen=True)
class FleetSpec:
    """The simulated fleet: ``runs`` x ``ranks_per_run`` ranks over ``producers`` processes."""

    runs: int = 64
    ranks_per_run: int = 64
    producers: int = 8
    seconds: float = 60.0
    interval: float = 1.0
    """Seconds between two messages of one rank."""
    steps_per_message: int = 4
    step_time: float = 0.25
    """The ``step_time`` ranks report (default: steps_per_message x step_time = interval, the wall pace)."""
    straggler_at: float = 10.0
    """Seconds after the start when the straggler slows down (< 0: no straggler)."""
    straggler_factor: float = 3.0
    nan_from: float = 5.0
    nan_every: float = 1.0
    """Seconds between two NaN injections (0: none)."""
    ack_timeout: float = 10.0
    seed: int = 7
    prefix: str = "fleet"

    @property
    def ranks(self) -> int:
        return self.runs * self.ranks_per_run

    def run_id(self, g: int) -> str:
        return f"{self.prefix}-{g // self.ranks_per_run:03d}"

    def rank_of(self, g: int) -> int:
        return g % self.ranks_per_run

    def owned(self, index: int) -> range:
        """The global rank numbers producer ``index`` sends for."""
        return range(index * self.ranks // self.producers, (index + 1) * self.ranks // self.producers)

    def phase(self, g: int) -> float:
        """Seconds into each interval at which rank ``g`` sends (spread evenly over the interval)."""
        return (g * _GOLDEN) % 1.0 * self.interval

    @property
    def straggler(self) -> int | None:
        return (2 * self.ranks) // 3 + 1 if self.straggler_at >= 0 and self.ranks > 1 else None

    def nan_targets(self) -> list[tuple[float, int]]:
        """(seconds after the start, global rank) of every NaN injection, each on a rank of its own."""
        if self.nan_every <= 0:
            return []
        times = np.arange(self.nan_from, self.seconds - self.interval, self.nan_every)
        ranks = [int(g) for g in np.random.default_rng(self.seed).permutation(self.ranks) if g != self.straggler]
        return [(float(t), g) for t, g in zip(times, ranks, strict=False)]

    def straggler_deadline_steps(self) -> int:
        """Two straggler windows (as the detector sizes them for this step time), in steps."""
        from trainvigil.daemon.detectors.straggler import StragglerSettings

        s = StragglerSettings()
        window = 2 * (max(s.min_steps, math.ceil(s.min_seconds / self.step_time)) // 2)
        return 2 * window

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FleetSpec:
        return cls(**json.loads(text))


# ---- one producer process ----------------------------------------------------------------------


@dataclass(frozen=True)
class Injection:
    run_id: str
    rank: int
    step: int
    t_log: float
    """The ``log()`` time stamped on the NaN step."""
    t_publish: float


@dataclass
class ProducerReport:
    index: int
    ranks: int
    messages: int = 0
    """Step messages acknowledged by JetStream."""
    steps: int = 0
    run_messages: int = 0
    resent: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    late_max_s: float = 0.0
    """The latest a message went out after its due time (the producer falling behind)."""
    t_last_publish: float = 0.0
    last_step: int = -1
    t_done: float = 0.0
    cpu_s: float = 0.0
    injections: list[Injection] = field(default_factory=list)
    straggler: tuple[str, int, int, float] | None = None
    """(run_id, rank, first slow step, its log() time) when this producer holds the straggler."""

    @classmethod
    def from_json(cls, text: str) -> ProducerReport:
        raw = json.loads(text)
        raw["injections"] = [Injection(**i) for i in raw["injections"]]
        raw["straggler"] = tuple(raw["straggler"]) if raw["straggler"] else None
        return cls(**raw)


@dataclass(frozen=True)
class _Out:
    subject: str
    payload: bytes
    msg_id: str
    steps: int


class _Publisher:
    """Pipelined JetStream publishes without a future per message: each goes out as a core publish whose
    reply subject is a token under one inbox; JetStream's acknowledgement comes back there. Whatever is
    refused, or not acknowledged within ``timeout``, goes again with the same ``Nats-Msg-Id``."""

    def __init__(self, nc: Any, timeout: float, report: ProducerReport) -> None:
        self.nc, self.timeout, self.report = nc, timeout, report
        self.inbox = nc.new_inbox()
        self.pending: dict[str, tuple[_Out, float]] = {}
        """Reply token -> (message, monotonic send time), oldest first."""
        self.retry: deque[_Out] = deque()
        self.failures: Counter[str] = Counter()
        self._tokens = itertools.count()

    async def start(self) -> None:
        await self.nc.subscribe(f"{self.inbox}.*", cb=self._acked)

    async def send(self, out: _Out) -> None:
        token = str(next(self._tokens))
        self.pending[token] = (out, time.monotonic())
        try:
            await self.nc.publish(out.subject, out.payload, reply=f"{self.inbox}.{token}",
                                  headers={"Nats-Msg-Id": out.msg_id})  # fmt: skip
        except Exception as exc:  # disconnected, buffer full: try again later
            del self.pending[token]
            self.failures[type(exc).__name__] += 1
            self.retry.append(out)

    async def _acked(self, msg: Any) -> None:
        entry = self.pending.pop(msg.subject.rpartition(".")[2], None)
        if entry is None:  # expired and already queued again
            return
        out = entry[0]
        try:
            ack = json.loads(msg.data)
        except ValueError:  # a status without a body: 503 no responders
            ack = {"error": {"description": (msg.headers or {}).get("Status", "no body")}}
        if "error" in ack:
            self.failures[str(ack["error"].get("description", "error"))] += 1
            self.retry.append(out)
        elif out.steps:
            self.report.messages += 1
            self.report.steps += out.steps
        else:
            self.report.run_messages += 1

    def expire(self) -> None:
        """Queue again what has waited longer than ``timeout`` for its acknowledgement."""
        limit = time.monotonic() - self.timeout
        for token, (out, sent) in list(self.pending.items()):
            if sent > limit:
                break
            del self.pending[token]
            self.failures["TimeoutError"] += 1
            self.retry.append(out)

    async def resend(self) -> None:
        self.expire()
        for _ in range(len(self.retry)):
            self.report.resent += 1
            await self.send(self.retry.popleft())

    async def settle(self, deadline: float) -> bool:
        """Resend until everything is acknowledged or ``deadline`` (monotonic) passes."""
        while self.pending or self.retry:
            if time.monotonic() > deadline:
                return False
            await self.resend()
            await asyncio.sleep(0.05)
        return True


class _Rank:
    """One simulated rank: its source, its message counter and what it injects."""

    __slots__ = ("g", "id_prefix", "nan_at", "run_id", "seq", "source", "speed", "subject")

    def __init__(self, spec: FleetSpec, g: int, nonce: str, nan_at: list[float]) -> None:
        self.g = g
        self.run_id = spec.run_id(g)
        rank = spec.rank_of(g)
        self.source = Source(
            run_id=self.run_id,
            rank=rank,
            world_size=spec.ranks_per_run,
            local_rank=rank % 8,
            host=f"node-{g // 8:04d}",
            pid=os.getpid(),
        )
        self.subject = DEFAULT_SUBJECTS.data(self.run_id, "metrics")
        self.id_prefix = f"{self.run_id}/{rank}/fleet/{nonce}"
        self.seq = 0
        # A fixed speed per rank, within +-2 %: the fastest rank is a little faster than the median.
        self.speed = 1.0 + 0.02 * (2 * ((g * 0.7548776662) % 1.0) - 1)
        self.nan_at = sorted(nan_at)

    def envelope(self, records: list[Any]) -> tuple[bytes, str]:
        self.seq += 1
        payload = encode(Envelope(source=self.source, seq=self.seq, records=records))
        return payload, f"{self.id_prefix}/{self.seq}"


def step_message(
    spec: FleetSpec, r: _Rank, k: int, t_send: float, t0: float, rng: np.random.Generator, report: ProducerReport
) -> _Out:
    """Message ``k`` of rank ``r``: steps ``k*n .. k*n+n-1`` logged over the interval before ``t_send``.

    The columns are built with NumPy straight into the agent's wire form (what ``build_step_batch`` makes
    of the same ``log()`` calls: ``tests/unit/test_fleet.py`` checks they are equal), so that the simulated
    fleet costs little beside the daemon it measures."""
    n = spec.steps_per_message
    first = k * n
    pace = spec.interval / n
    noise = rng.standard_normal((3, n))
    slow = spec.straggler == r.g and t_send - t0 >= spec.straggler_at
    if slow and report.straggler is None:
        report.straggler = (r.run_id, r.source.rank, first, t_send - (n - 1) * pace)
    nan = bool(r.nan_at) and r.nan_at[0] <= t_send - t0
    steps = np.arange(first, first + n, dtype=_I8)
    loss = (2.0 * np.exp(-steps / 20_000) + 0.3) * (1 + 0.01 * noise[0])
    if nan:
        loss[-1] = math.nan
    factor = spec.straggler_factor if slow else 1.0
    metrics = {
        "loss": loss,
        "grad_norm": 1.0 + 0.02 * noise[1],
        "lr": np.full(n, 3e-4),
        "step_time": spec.step_time * r.speed * factor * np.exp(0.02 * noise[2]),
        "samples": 32.0 * steps,
        "tokens": 65536.0 * steps,
    }
    batch = StepBatch(
        time=t_send,
        step=steps.tobytes(),
        times=(t_send - (n - 1 - np.arange(n)) * pace).tobytes(),
        columns={name: Column(values=values.astype(_F8).tobytes()) for name, values in metrics.items()},
    )
    payload, msg_id = r.envelope([batch])
    report.last_step = max(report.last_step, first + n - 1)
    if nan:
        r.nan_at.pop(0)
        report.injections.append(Injection(r.run_id, r.source.rank, first + n - 1, t_send, time.time()))
    return _Out(r.subject, payload, msg_id, n)


async def _connect(url: str, name: str) -> Any:
    import nats

    return await nats.connect(
        url,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.25,  # type: ignore[arg-type]
        pending_size=64 * 2**20,
    )


async def produce(spec: FleetSpec, index: int, url: str, ready: IO[str], go: IO[str]) -> ProducerReport:
    """Producer ``index`` of ``spec``: see the module docstring."""
    report = ProducerReport(index=index, ranks=len(spec.owned(index)))
    nonce = secrets.token_hex(6)
    nans: dict[int, list[float]] = {}
    for t, g in spec.nan_targets():
        nans.setdefault(g, []).append(t)
    ranks = [_Rank(spec, g, nonce, nans.get(g, [])) for g in spec.owned(index)]
    order = sorted(ranks, key=lambda r: spec.phase(r.g))
    nc = await _connect(url, f"fleet-{index}")
    pub = _Publisher(nc, spec.ack_timeout, report)
    await pub.start()
    rng = np.random.default_rng([spec.seed, index])
    try:
        for r in ranks:
            payload, msg_id = r.envelope([RunStart(time=time.time(), argv=["fleet"], agent_version="fleet")])
            await pub.send(_Out(DEFAULT_SUBJECTS.data(r.run_id, "run"), payload, msg_id, 0))
        if not await pub.settle(time.monotonic() + 60):
            raise RuntimeError(f"producer {index}: RunStart not acknowledged: {dict(pub.failures)}")
        print("ready", file=ready, flush=True)
        line = await asyncio.to_thread(go.readline)
        t0 = float(line.split()[1])
        cpu0 = time.process_time()
        await _publish_until(spec, order, t0, rng, pub, report)
        for r in ranks:
            payload, msg_id = r.envelope([RunEnd(time=time.time(), status="ok")])
            await pub.send(_Out(DEFAULT_SUBJECTS.data(r.run_id, "run"), payload, msg_id, 0))
        if not await pub.settle(time.monotonic() + 120):
            raise RuntimeError(f"producer {index}: not everything acknowledged: {dict(pub.failures)}")
        report.cpu_s = time.process_time() - cpu0
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)
    report.failures = dict(pub.failures)
    report.t_done = time.time()
    return report


async def _publish_until(
    spec: FleetSpec, order: list[_Rank], t0: float, rng: np.random.Generator, pub: _Publisher, report: ProducerReport
) -> None:
    """Every rank sends at ``t0 + phase + k * interval`` until ``t0 + seconds``."""
    phases = [spec.phase(r.g) for r in order]
    n, per_round = 0, len(order)
    while True:
        k, i = divmod(n, per_round)
        due = t0 + phases[i] + k * spec.interval
        if due - t0 >= spec.seconds:
            break
        now = time.time()
        if due > now:
            await pub.resend()
            await asyncio.sleep(max(due - now, TICK_S))
            continue
        report.late_max_s = max(report.late_max_s, now - due)
        await pub.send(step_message(spec, order[i], k, due, t0, rng, report))
        report.t_last_publish = time.time()
        n += 1


# ---- the coordinator's side --------------------------------------------------------------------


class Fleet:
    """The producer processes of one spec, each connected and waiting for ``go``."""

    def __init__(self, spec: FleetSpec, url: str, log_dir: Path) -> None:
        self.spec, self.url, self.log_dir = spec, url, log_dir
        self.processes: list[subprocess.Popen[bytes]] = []
        self.t0 = 0.0

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def start(self, timeout: float = 120.0) -> None:
        for i in range(self.spec.producers):
            with open(self.log_dir / f"fleet-{i}.log", "ab") as log:
                argv = [sys.executable, __file__, str(i), self.url, self.spec.to_json()]
                self.processes.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log))
        deadline = time.monotonic() + timeout
        for i, p in enumerate(self.processes):
            assert p.stdout is not None
            line = p.stdout.readline()  # a producer that fails exits, which ends the read
            if line.strip() != b"ready" or time.monotonic() > deadline:
                raise RuntimeError(f"fleet producer {i} did not get ready: {self._tail(i)}")

    def go(self, delay: float = 0.5) -> float:
        """Release every producer; returns the shared start time (Unix seconds)."""
        self.t0 = time.time() + delay
        for p in self.processes:
            assert p.stdin is not None
            p.stdin.write(f"go {self.t0!r}\n".encode())
            p.stdin.close()
        return self.t0

    def cpu_seconds(self) -> float:
        """CPU seconds of the live producer processes so far (``/proc``)."""
        total = 0.0
        for p in self.processes:
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{p.pid}/stat").read_text().rpartition(")")[2].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def running(self) -> bool:
        """True while a producer runs; raises once one has failed."""
        for i, p in enumerate(self.processes):
            if p.poll() not in (None, 0):
                raise RuntimeError(f"fleet producer {i} exited with {p.returncode}: {self._tail(i)}")
        return any(p.poll() is None for p in self.processes)

    def wait(self, timeout: float) -> list[ProducerReport]:
        reports = []
        deadline = time.monotonic() + timeout
        for i, p in enumerate(self.processes):
            assert p.stdout is not None
            out = p.stdout.read()
            if p.wait(max(1.0, deadline - time.monotonic())) != 0 or not out.strip():
                raise RuntimeError(f"fleet producer {i} failed ({p.returncode}): {self._tail(i)}")
            reports.append(ProducerReport.from_json(out.decode().strip().splitlines()[-1]))
        return reports

    def kill(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.kill()
                p.wait()
            for pipe in (p.stdin, p.stdout):
                if pipe is not None:
                    pipe.close()

    def _tail(self, i: int) -> str:
        return (self.log_dir / f"fleet-{i}.log").read_text()[-2000:]


class AlertWatch:
    """Every alert update the daemon publishes on ``vigil.v1.alerts.>``, with its arrival time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._alerts: list[tuple[float, Anomaly]] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="alert-watch", daemon=True)

    def __enter__(self) -> AlertWatch:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"could not subscribe to {ALERTS} at {self.url}: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def alerts(self) -> list[tuple[float, Anomaly]]:
        with self._lock:
            return list(self._alerts)

    def _main(self) -> None:
        try:
            asyncio.run(self._watch())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _watch(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()

        async def on_msg(msg: Any) -> None:
            arrived = time.time()
            found = [r for r in decode(msg.data).records if isinstance(r, Anomaly)]
            with self._lock:
                self._alerts.extend((arrived, a) for a in found)

        nc = await _connect(self.url, "fleet-alert-watch")
        try:
            await nc.subscribe(ALERTS, cb=on_msg)
            await nc.flush()
            self._ready.set()
            await self._stop.wait()
        finally:
            await nc.close()


@dataclass(frozen=True)
class StragglerVerdict:
    run_id: str
    rank: int
    first_slow_step: int
    t_first_slow: float
    deadline_steps: int
    named_step: int | None
    """The step the first straggler alert naming the rank is about (``None``: never named)."""
    named_after_s: float | None
    """Seconds from the first slow step's log() time to the alert arriving."""
    others_named: int
    """Straggler alerts opened on other ranks (false positives)."""
    last_step: int
    """The fleet's last step: a straggler is named once every rank of its run is past its second slow window."""

    @property
    def late_steps(self) -> int | None:
        return None if self.named_step is None else self.named_step - self.first_slow_step

    @property
    def in_time(self) -> bool:
        return self.late_steps is not None and self.late_steps <= self.deadline_steps


def straggler_verdict(
    spec: FleetSpec, reports: Sequence[ProducerReport], alerts: Sequence[tuple[float, Anomaly]]
) -> StragglerVerdict | None:
    """Whether and when the ``straggler`` detector named the slow rank (``None``: it never slowed)."""
    found = [r.straggler for r in reports if r.straggler is not None]
    if not found:
        return None
    run_id, rank, first, t_first = found[0]
    opened = [(t, a) for t, a in alerts if a.detector == "straggler" and a.state == "open"]
    mine = [(t, a) for t, a in opened if (a.run_id, a.rank) == (run_id, rank)]
    named_step = mine[0][1].step if mine else None
    named_after = mine[0][0] - t_first if mine else None
    others = len(opened) - len(mine)
    last = max(r.last_step for r in reports)
    return StragglerVerdict(
        run_id, rank, first, t_first, spec.straggler_deadline_steps(), named_step, named_after, others, last
    )


@dataclass(frozen=True)
class NanLatency:
    injected: int
    log_to_alert_s: np.ndarray
    """Per injection that got its ``non_finite`` alert: arrival minus the NaN step's log() time."""
    publish_to_alert_s: np.ndarray

    @property
    def missed(self) -> int:
        return self.injected - len(self.log_to_alert_s)


def nan_latencies(reports: Sequence[ProducerReport], alerts: Sequence[tuple[float, Anomaly]]) -> NanLatency:
    """Match every NaN injection with the ``non_finite`` alert that opened on its step."""
    first: dict[tuple[str, int, int | None], float] = {}
    for t, a in alerts:
        if a.detector == "non_finite" and a.state == "open":
            first.setdefault((a.run_id, a.rank, a.step), t)
    injections = [i for r in reports for i in r.injections]
    log_lat, pub_lat = [], []
    for i in injections:
        arrived = first.get((i.run_id, i.rank, i.step))
        if arrived is not None:
            log_lat.append(arrived - i.t_log)
            pub_lat.append(arrived - i.t_publish)
    return NanLatency(len(injections), np.array(log_lat), np.array(pub_lat))


def main(argv: Sequence[str]) -> int:
    index, url, spec_json = argv
    report = asyncio.run(produce(FleetSpec.from_json(spec_json), int(index), url, sys.stdout, sys.stdin))
    print(json.dumps(asdict(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
