"""The daemon's memory after a cardinality flood: many runs x ranks x metric names, then silence.

A real nats-server and ``vigil up`` with a short ``[detectors] idle_forget_s``; raw envelopes are
published with nats-py (one message of one step per rank, each rank logging ``--names`` metric names
of its run's own), as ``bench/fleet.py`` publishes a fleet. The daemon's RSS (``VmRSS``) and the
number of ``/metrics`` series are read before the flood, once every message is committed, and once
the idle time-out has passed (the per-run state forgotten), and printed as a table.

    python bench/cardinality.py [--runs 2000] [--ranks 50] [--names 20] [--idle-forget-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _procs import start_daemon, start_nats
from fleet import ProducerReport, _connect, _Out, _Publisher

from trainvigil.schemas import DEFAULT_SUBJECTS, Column, Envelope, Source, StepBatch, encode
from trainvigil.testing import memory_mib, scrape, wait_until

_F8, _I8 = np.dtype("<f8"), np.dtype("<i8")


@dataclass(frozen=True)
class Flood:
    runs: int
    ranks: int
    names: int
    prefix: str = "card"

    @property
    def messages(self) -> int:
        return self.runs * self.ranks

    def run_id(self, run: int) -> str:
        return f"{self.prefix}-{run:06d}"


def forgetting_env(idle_forget_s: float) -> dict[str, str]:
    """The daemon's settings for a flood: a short idle time-out, and silence watchers that page before it
    (``run_failed`` off: a flood of runs that all vanish would page each one lost, which is its job)."""
    return {
        "VIGIL_DETECTORS_IDLE_FORGET_S": str(idle_forget_s),
        "VIGIL_DETECTORS_RUN_FAILED_ENABLED": "false",
        "VIGIL_DETECTORS_STALL_MIN_SECONDS": "2",
        "VIGIL_DETECTORS_HANG_MIN_SECONDS": "2",
    }


def step_message(run_id: str, rank: int, world_size: int, step: int, t: float, metrics: dict[str, float]) -> _Out:
    """One rank's message of one step (``metrics``: name -> value), as an agent's interval flush sends it."""
    columns = {name: Column(values=np.full(1, value, _F8).tobytes()) for name, value in metrics.items()}
    batch = StepBatch(time=t, step=np.full(1, step, _I8).tobytes(), times=np.full(1, t, _F8).tobytes(), columns=columns)
    source = Source(run_id=run_id, rank=rank, world_size=world_size, host=f"h{rank // 8}", pid=1)
    payload = encode(Envelope(source=source, seq=step + 1, records=[batch]))
    return _Out(DEFAULT_SUBJECTS.data(run_id, "metrics"), payload, f"{run_id}/{rank}/card/{step}", 1)


def messages(flood: Flood, t: float) -> list[_Out]:
    """One message per rank: one step, a loss and ``flood.names`` metric names its run alone logs."""
    out: list[_Out] = []
    for run in range(flood.runs):
        run_id = flood.run_id(run)
        metrics = {"loss": 1.0} | {f"m{run}_{j}": 1.0 for j in range(flood.names)}
        out.extend(step_message(run_id, rank, flood.ranks, 0, t, metrics) for rank in range(flood.ranks))
    return out


async def publish(url: str, outs: Sequence[_Out]) -> ProducerReport:
    """Publish ``outs`` through JetStream (message ids, acknowledged; refused ones go again)."""
    report = ProducerReport(index=0, ranks=len(outs))
    nc = await _connect(url, "cardinality")
    pub = _Publisher(nc, 30.0, report)
    await pub.start()
    try:
        for k, out in enumerate(outs):
            await pub.send(out)
            if k % 2000 == 1999:  # let acknowledgements in, so the pending table stays small
                await nc.flush()
                await pub.resend()
        if not await pub.settle(time.monotonic() + 300):
            raise RuntimeError(f"the flood was not acknowledged: {dict(pub.failures)}")
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)
    return report


def series(port: int, prefix: str = "") -> int:
    """``/metrics`` series (those naming a run id starting ``prefix`` when given)."""
    names = scrape(port)
    return sum(1 for name in names if f'run_id="{prefix}' in name) if prefix else len(names)


def committed(port: int) -> int:
    return int(scrape(port).get("vigil_messages_ingested_total", 0))


@dataclass(frozen=True)
class Reading:
    rss_mib: float
    series: int
    run_series: int


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=50)
    parser.add_argument("--names", type=int, default=20)
    parser.add_argument("--idle-forget-s", type=float, default=20.0)
    args = parser.parse_args(argv)
    flood = Flood(args.runs, args.ranks, args.names)
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        nats_proc, url = start_nats(stack, tmp)
        os.environ.update(forgetting_env(args.idle_forget_s))
        svc = start_daemon(stack, tmp, nats_proc, url)
        pid, port = svc.daemon.pid, svc.http_port

        def read() -> Reading:
            return Reading(memory_mib(pid, "VmRSS"), series(port), series(port, flood.prefix))

        base = read()
        t0 = time.monotonic()
        asyncio.run(publish(url, messages(flood, time.time())))
        wait_until(lambda: committed(port) >= flood.messages, 600, "every message to be committed", 0.5)
        flooded = read()
        took = time.monotonic() - t0
        # The time-out itself is what is measured: a stream goes between 1 and 1.25 time-outs after
        # its last record (the sweeps' period), and the heap is trimmed when the ingest is idle.
        time.sleep(args.idle_forget_s * 1.5 + 10)
        after = read()
    print(f"{flood.runs} runs x {flood.ranks} ranks x {flood.names} names: {flood.messages} messages in {took:.0f} s")
    print(f"{'':24} {'RSS MiB':>9} {'/metrics series':>16} {'of the runs':>12}")
    for label, r in (("baseline", base), ("after the flood", flooded), ("after the idle time-out", after)):
        print(f"{label:24} {r.rss_mib:9.0f} {r.series:16d} {r.run_series:12d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
