"""The daemon's memory during and after a flood: a real nats-server, ``vigil up``
with its defaults, and agent processes logging as fast as they can for ``--seconds``.

Prints the daemon's RSS every few seconds, its peak during the flood, and where it settles
once the flood is over, next to the steps it committed and its consumer lag. Meanwhile a
normal run logs 100 steps/s and a NaN every ``--nan-every`` seconds: the seconds from each NaN
to its page on the alert subject say whether the flood delays another run's alerts.

    python bench/flood.py [--seconds 60] [--agents 4] [--after 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import nats

from trainvigil.daemon.broker.embedded import find_binary, free_port, port_open, server_args
from trainvigil.schemas import DEFAULT_SUBJECTS, Anomaly, decode
from trainvigil.testing import scrape, wait_until

AGENT = """
import sys, time, trainvigil
agent = trainvigil.init(run_id=sys.argv[1], rank=int(sys.argv[2]))
deadline, step = time.monotonic() + float(sys.argv[3]), 0
while time.monotonic() < deadline:
    for _ in range(1000):
        agent.log(step, loss=1.0 / (step + 1), grad_norm=0.5, lr=1e-3, step_time=0.01, samples=32.0, tokens=4096.0)
        step += 1
print(step, agent.close(timeout=120), flush=True)
"""

NORMAL = """
import sys, time, trainvigil
agent = trainvigil.init(run_id="normal")
deadline, every, step, next_nan = time.monotonic() + float(sys.argv[1]), float(sys.argv[2]), 0, time.monotonic()
while time.monotonic() < deadline:
    nan = time.monotonic() >= next_nan and step > 0
    if nan:
        next_nan += every
        print("nan", step, time.time(), flush=True)
    agent.log(step, loss=float("nan") if nan else 1.0 / (step + 1), grad_norm=0.5, lr=1e-3)
    step += 1
    time.sleep(0.01)
print("end", step, agent.close(timeout=120), flush=True)
"""


async def _watch_alerts(url: str, pages: dict[int, float], stop: threading.Event) -> None:
    """Record when the first non_finite alert of each step of the normal run arrives."""
    nc = await nats.connect(url)

    async def on_alert(msg: Any) -> None:
        for anomaly in decode(msg.data).records:
            if isinstance(anomaly, Anomaly) and anomaly.detector == "non_finite" and anomaly.step is not None:
                pages.setdefault(anomaly.step, time.time())

    await nc.subscribe(DEFAULT_SUBJECTS.alert("normal"), cb=on_alert)
    while not stop.is_set():
        await asyncio.sleep(0.1)
    await nc.close()


def _latencies(normal: subprocess.Popen[bytes], pages: dict[int, float]) -> list[float | None]:
    """Seconds from each NaN the normal run logged to its alert (None: never alerted)."""
    out = normal.stdout.read().decode() if normal.stdout else ""
    nans = [line.split() for line in out.splitlines() if line.startswith("nan ")]
    return [pages[int(step)] - float(t) if int(step) in pages else None for _, step, t in nans]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the agents flood")
    parser.add_argument("--agents", type=int, default=4, help="agent processes")
    parser.add_argument("--after", type=float, default=30.0, help="seconds to watch the daemon after the flood")
    parser.add_argument("--nan-every", type=float, default=10.0, help="seconds between the normal run's NaNs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port, http = free_port(), free_port()
        url = f"nats://127.0.0.1:{port}"
        server = subprocess.Popen(server_args(find_binary(), port, Path(tmp) / "js"), stdout=subprocess.DEVNULL)
        wait_until(lambda: port_open("127.0.0.1", port), 10, "nats-server")
        log = open(Path(tmp) / "daemon.log", "wb")  # noqa: SIM115 - closed below
        cmd = [sys.executable, "-m", "trainvigil.daemon.cli", "up", "--nats", url, "--data-dir", f"{tmp}/data"]
        daemon = subprocess.Popen([*cmd, "--http-port", str(http)], stdout=log, stderr=log)
        wait_until(lambda: port_open("127.0.0.1", http), 30, "the daemon")
        idle = rss_mib(daemon.pid)
        env = {**os.environ, "VIGIL_NATS_URL": url}
        agents = [
            subprocess.Popen(
                [sys.executable, "-c", AGENT, "flood", str(r), str(args.seconds)], env=env, stdout=subprocess.PIPE
            )
            for r in range(args.agents)
        ]
        normal = subprocess.Popen(
            [sys.executable, "-c", NORMAL, str(args.seconds), str(args.nan_every)], env=env, stdout=subprocess.PIPE
        )
        pages: dict[int, float] = {}
        stop_watch = threading.Event()
        watcher = threading.Thread(target=asyncio.run, args=(_watch_alerts(url, pages, stop_watch),), daemon=True)
        watcher.start()
        started, peak, rows = time.monotonic(), idle, []
        print(f"{'t (s)':>6} {'phase':>6} {'daemon RSS (MiB)':>17} {'steps committed':>16} {'consumer lag':>13}")
        flooding = True
        while True:
            time.sleep(5)
            t = time.monotonic() - started
            if flooding and all(a.poll() is not None for a in [*agents, normal]):
                flooding, ended = False, t
            if not flooding and t - ended >= args.after:
                break
            m = scrape(http)
            rss = rss_mib(daemon.pid)
            peak = max(peak, rss)
            row = (t, "flood" if flooding else "after", rss, int(m.get('vigil_events_ingested_total{kind="steps"}', 0)))
            rows.append(row)
            print(f"{row[0]:6.0f} {row[1]:>6} {row[2]:17.0f} {row[3]:16,d} {int(m.get('vigil_consumer_lag', 0)):13,d}")
        logged = sum(int(a.stdout.read().split()[0]) for a in agents if a.stdout)
        latencies = _latencies(normal, pages)
        stop_watch.set()
        watcher.join(10)
        daemon.terminate()
        daemon.wait(60)
        server.terminate()
        log.close()
    print(
        f"\nidle {idle:.0f} MiB, peak {peak:.0f} MiB (flood and drain),"
        f" {args.after:.0f} s after: {rows[-1][2]:.0f} MiB; steps logged {logged:,d}, committed {rows[-1][3]:,d}"
    )
    shown = ", ".join("missed" if x is None else f"{x:.2f}" for x in latencies)
    print(f"the normal run's NaN → page, seconds: {shown or 'no NaN logged'}")


if __name__ == "__main__":
    main()
