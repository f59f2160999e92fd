"""``ingest.py --backlog``: agents fill the stream while no daemon runs, then ``vigil up --drain`` empties it.

The stream is created first as the daemon would (``ensure_stream`` with the default stream
settings: 10 GiB, 100 000 messages per subject, ``discard = new``). N agents with default
options log S steps each and close; then the daemon starts with ``--drain`` (detectors on,
``/metrics`` on) and exits once every message is stored. The drain rate runs from spawning
the daemon to its exit, start-up included. The daemon's peak RSS and CPU time come from
``wait4``'s resource usage (``ru_maxrss`` is the kernel's high-water mark, like ``VmHWM``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _agents import ProducerResult, collect, go, spawn_producers
from _procs import daemon_argv, log_events, spawn, start_nats, stored_rows
from tables import table

from trainvigil.testing import STEPS_SERIES, scrape

POLL_S = 0.5


@dataclass(frozen=True)
class StreamState:
    messages: int
    bytes: int


async def _stream(url: str, create: bool) -> StreamState:
    import nats

    from trainvigil.daemon.broker.jetstream import ensure_stream
    from trainvigil.daemon.config import StreamConfig
    from trainvigil.daemon.logs import configure

    configure("console", "warning")  # ensure_stream logs the stream it created

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        if create:
            await ensure_stream(js, StreamConfig())
        info = await js.stream_info(StreamConfig().name)
        return StreamState(int(info.state.messages), int(info.state.bytes))
    finally:
        await nc.close()


@dataclass(frozen=True)
class Backlog:
    agents: int
    steps_per_agent: int
    fill_s: float
    """From releasing the agents to the last ``close()`` (everything acknowledged by JetStream)."""
    stream: StreamState
    drain_s: float
    """From spawning ``vigil up --drain`` to its exit."""
    metrics_up_s: float
    """From spawning the daemon to its ``/metrics`` answering (start-up)."""
    first_commit_s: float
    cpu_s: float
    peak_rss_mib: float
    rows: int
    distinct: int
    log_events: dict[str, int]

    @property
    def total(self) -> int:
        return self.agents * self.steps_per_agent

    @property
    def steps_per_s(self) -> float:
        return self.total / self.drain_s


def _drain(stack: contextlib.ExitStack, tmp: Path, url: str) -> tuple[float, float, float, float, float]:
    """Run ``vigil up --drain`` to its exit: (wall s, /metrics up at, first commit at, CPU s, peak RSS MiB)."""
    from trainvigil.daemon.broker.embedded import free_port

    http_port, log = free_port(), tmp / "daemon.log"
    argv = daemon_argv(url, tmp / "data", http_port, "--drain")
    env = {**os.environ, "VIGIL_LOG_LEVEL": "warning"}
    started = time.monotonic()
    daemon = spawn(stack, argv, log, stdout=subprocess.DEVNULL, env=env)
    metrics_up = first_commit = float("nan")
    while True:
        pid, status, usage = os.wait4(daemon.pid, os.WNOHANG)
        if pid:
            ended = time.monotonic()
            daemon.returncode = os.waitstatus_to_exitcode(status)
            break
        if first_commit != first_commit:  # NaN: not seen yet
            with contextlib.suppress(OSError, KeyError):
                committed = scrape(http_port)[STEPS_SERIES]
                if metrics_up != metrics_up:
                    metrics_up = time.monotonic() - started
                if committed > 0:
                    first_commit = time.monotonic() - started
        time.sleep(POLL_S if first_commit == first_commit else 0.01)
    if daemon.returncode != 0:
        raise RuntimeError(f"vigil up --drain exited with {daemon.returncode}: {log.read_text()[-2000:]}")
    return ended - started, metrics_up, first_commit, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def run_backlog(agents: int, steps: int) -> Backlog:
    with tempfile.TemporaryDirectory(prefix="bench-backlog-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        _, url = start_nats(stack, tmp)
        asyncio.run(_stream(url, create=True))
        producers = spawn_producers(stack, tmp, [[f"backlog-{i}", url, str(steps)] for i in range(agents)])
        started = go(producers)
        results: list[ProducerResult] = collect(producers, timeout=3600)
        undelivered = [r.run_id for r in results if not r.delivered or r.dropped]
        if undelivered:
            raise RuntimeError(f"agents dropped or did not deliver: {undelivered}")
        fill_s = max(r.t_closed for r in results) - started
        state = asyncio.run(_stream(url, create=False))
        drain = _drain(stack, tmp, url)
        rows = stored_rows(tmp / "data" / "vigil.duckdb", "backlog-%")
        events = log_events(tmp / "daemon.log")
        events.pop("anomaly", None)
        drained = dict(zip(("drain_s", "metrics_up_s", "first_commit_s", "cpu_s", "peak_rss_mib"), drain, strict=True))
        return Backlog(
            agents, steps, fill_s, state, **drained, rows=rows.rows, distinct=rows.distinct, log_events=dict(events)
        )


def format_backlog(b: Backlog) -> str:
    ok = "OK" if b.rows == b.distinct == b.total else "MISMATCH"
    head = ["agents", "steps/agent", "stream msgs", "stream MiB", "fill s", "drain s", "drain steps/s"]
    head += ["/metrics up s", "first commit s", "daemon CPU s", "peak RSS MiB", "rows stored (distinct)"]
    row = [
        b.agents,
        f"{b.steps_per_agent:,}",
        f"{b.stream.messages:,}",
        f"{b.stream.bytes / 2**20:,.0f}",
        f"{b.fill_s:.1f}",
        f"{b.drain_s:.1f}",
        f"{b.steps_per_s:,.0f}",
        f"{b.metrics_up_s:.2f}",
        f"{b.first_commit_s:.2f}",
        f"{b.cpu_s:.1f}",
        f"{b.peak_rss_mib:,.0f}",
        f"{b.rows:,} ({b.distinct:,}) / {b.total:,} {ok}",
    ]
    return table(head, [row])


def backlog_targets(b: Backlog, target_steps_per_s: float, target_rss_mib: float) -> list[str]:
    rate_ok = b.steps_per_s >= target_steps_per_s
    rss_ok = b.peak_rss_mib < target_rss_mib
    return [
        f"drain >= {target_steps_per_s:,.0f} steps/s (start-up included): {b.steps_per_s:,.0f}  "
        f"{'PASS' if rate_ok else 'FAIL'}",
        f"daemon peak RSS < {target_rss_mib:,.0f} MiB: {b.peak_rss_mib:,.0f}  {'PASS' if rss_ok else 'FAIL'}",
        f"rows: {b.rows:,} stored, {b.distinct:,} distinct (run, rank, step), {b.total:,} logged  "
        f"{'PASS' if b.rows == b.distinct == b.total else 'FAIL'}",
        f"daemon log, warnings and errors besides alerts: {b.log_events or 'none'}",
    ]
