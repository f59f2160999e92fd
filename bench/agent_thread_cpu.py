"""What the agent's own thread runs, by the training loop's step rate: its CPU time and context switches per second.

A real nats-server and daemon run on the machine's last core; the training process on core 0 logs a 0-d
tensor and a float per step at each ``--rates`` value for ``--seconds`` (steps paced by a busy wait, so the
core stays busy as a training's does), one agent per rate. The agent thread's CPU time comes from its
``/proc/self/task/TID/schedstat`` (kernel time included), its switches from the same task's ``status``.
An idle or slow loop's agent is the case this shows: its cost is wake-ups, not steps.

    python bench/agent_thread_cpu.py                       # rates 0, 0.2, 1, 10, 660 steps/s, 12 s each
    python bench/agent_thread_cpu.py --rates 0 1 --seconds 30
    python bench/agent_thread_cpu.py --offline --rates 10 660   # no broker: every message to the spill file
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

from _procs import start_services
from tables import table

from trainvigil.daemon.broker.embedded import free_port


def _cpu_ns(tid: int) -> int:
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])


def _switches(tid: int) -> int:
    lines = Path(f"/proc/self/task/{tid}/status").read_text().splitlines()
    return sum(int(line.split()[1]) for line in lines if "ctxt_switches" in line)


def measure(rate: float, seconds: float) -> tuple[int, float, float]:
    """Steps logged, and the agent thread's CPU ms and switches per second, at ``rate`` steps a second."""
    import torch

    import trainvigil

    agent = trainvigil.init(run_id=f"thread-cpu-{rate:g}-{os.getpid()}")
    try:
        agent.flush(10)  # run_start delivered (offline: on disk, once the first connect failed)
        time.sleep(0.5)  # past the start-up (connect, run_start)
        assert agent._worker is not None
        tid = agent._worker.thread.native_id
        assert tid is not None
        one = torch.ones(())
        cpu, switches = _cpu_ns(tid), _switches(tid)
        steps = 0
        start = time.perf_counter()
        due = start
        while (now := time.perf_counter()) < start + seconds:
            if rate and now >= due:
                agent.log(steps, loss=(one * steps).detach(), step_time=0.1)
                steps += 1
                due += 1.0 / rate
        cpu, switches = _cpu_ns(tid) - cpu, _switches(tid) - switches
    finally:
        agent.close()
    return steps, cpu / 1e6 / seconds, switches / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0, 0.2, 1, 10, 660], help="steps per second")
    parser.add_argument("--seconds", type=float, default=12.0, help="per rate")
    parser.add_argument(
        "--offline", action="store_true", help="no broker (a closed port): the agent keeps everything in its spill file"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-thread-") as name, contextlib.ExitStack() as stack:
        os.sched_setaffinity(0, {0})
        os.environ.update(VIGIL_LOG_LEVEL="warning", VIGIL_SPILL_DIR=str(Path(name) / "spill"))
        if args.offline:
            os.environ.update(VIGIL_NATS_URL=f"nats://127.0.0.1:{free_port()}", VIGIL_CLOSE_TIMEOUT="1")
            print("  no broker (a closed port): training and agent on cpu 0", flush=True)
        else:
            svc = start_services(stack, Path(name))
            last = (os.cpu_count() or 1) - 1
            svc.pin(last)
            os.environ.update(VIGIL_NATS_URL=svc.url)
            print(f"  nats-server and the daemon on cpu {last}; training and agent on cpu 0", flush=True)
        rows = []
        for rate in args.rates:
            steps, cpu_ms, switches = measure(rate, args.seconds)
            rows.append((f"{rate:g}", steps, f"{cpu_ms:.2f}", f"{switches:.1f}"))
            print(f"  {rate:g} steps/s done", flush=True)
    print()
    print(table(("steps/s", "steps logged", "agent thread CPU ms/s", "agent thread switches/s"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
