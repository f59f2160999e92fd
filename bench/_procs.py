"""The ingest benches' processes and probes: nats-server, the daemon, ``/metrics``, ``/proc``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainvigil.testing import STEPS_SERIES, memory_mib, scrape, wait_until

LAG_SERIES = "vigil_consumer_lag"
WRITE_SECONDS_SERIES = "vigil_batch_write_seconds_sum"
COMMITS_SERIES = "vigil_batch_write_seconds_count"
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def children_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the children ``pid`` has waited for (and theirs), from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[13]) + int(fields[14])) / _TICK


def machine_cpu() -> tuple[float, float, float]:
    """Seconds since boot the machine's CPUs spent (busy, in iowait, in all), from ``/proc/stat``."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle, iowait = fields[3], fields[4]
    total = sum(fields[:8])  # guest time is already in user
    return (total - idle - iowait) / _TICK, iowait / _TICK, total / _TICK


def log_events(path: Path, least: str = "warning") -> Counter[str]:
    """How often each event was logged at ``least`` or above in a daemon's JSON log."""
    levels = ("debug", "info", "warning", "error", "critical")
    wanted = set(levels[levels.index(least) :])
    found: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError, AttributeError):
            record = json.loads(line)
            if record.get("level") in wanted:
                found[str(record.get("event"))] += 1
    return found


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

    def pin(self, cpu: int) -> None:
        """nats-server and the daemon, every thread, onto ``cpu`` (a sidecar's core of its own)."""
        for pid in (self.nats.pid, self.daemon.pid):
            pin(pid, {cpu})


def start_nats(stack: contextlib.ExitStack, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``nats-server -js`` on a free port with its store under ``tmp``; returns it and its URL."""
    from trainvigil.daemon.broker.embedded import find_binary, free_port, port_open, server_args

    port, log = free_port(), tmp / "nats-server.log"
    nats = spawn(stack, server_args(find_binary(), port, tmp / "jetstream"), log, stdout=subprocess.DEVNULL)
    wait_until(lambda: alive(nats, log) and port_open("127.0.0.1", port), 10, "nats-server to listen")
    return nats, f"nats://127.0.0.1:{port}"


def daemon_argv(url: str, data_dir: Path, http_port: int, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "trainvigil.daemon.cli", "up", "--nats", url]
    return [*argv, "--data-dir", str(data_dir), "--http-port", str(http_port), *extra]


def start_daemon(
    stack: contextlib.ExitStack, tmp: Path, nats: subprocess.Popen[bytes], url: str, extra: Sequence[str] = ()
) -> Services:
    """The daemon against ``url`` with ``/metrics`` on a free port, once ``/metrics`` answers."""
    from trainvigil.daemon.broker.embedded import free_port

    http_port, data_dir, log = free_port(), tmp / "data", tmp / "daemon.log"
    env = {**os.environ, "VIGIL_LOG_LEVEL": "warning"}
    daemon = spawn(stack, daemon_argv(url, data_dir, http_port, *extra), log, stdout=subprocess.DEVNULL, env=env)

    def answers() -> bool:
        alive(daemon, log)
        with contextlib.suppress(OSError):
            return STEPS_SERIES in scrape(http_port)
        return False

    wait_until(answers, 60, "the daemon's /metrics")
    return Services(nats, daemon, url, http_port, data_dir / "vigil.duckdb")


def start_services(stack: contextlib.ExitStack, tmp: Path) -> Services:
    """nats-server with JetStream on a free port, then the daemon against it with ``/metrics`` on another."""
    nats, url = start_nats(stack, tmp)
    return start_daemon(stack, tmp, nats, url)


def shut_down(svc: Services) -> float:
    """SIGTERM the daemon (it drains and commits); returns its peak RSS in MiB, read just before."""
    rss = memory_mib(svc.daemon.pid)
    svc.daemon.send_signal(signal.SIGTERM)
    code = svc.daemon.wait(60)
    if code != 0:
        raise RuntimeError(f"daemon exited with {code} after SIGTERM")
    return rss


@dataclass(frozen=True)
class Stored:
    rows: int
    distinct: int
    """Distinct (run_id, rank, step)."""


def stored_rows(db_path: Path, run_like: str = "%") -> Stored:
    """Rows of ``steps`` (of runs whose id is LIKE ``run_like``) in the file of a stopped daemon."""
    import duckdb

    sql = "SELECT count(*), count(DISTINCT (run_id, rank, step)) FROM steps WHERE run_id LIKE ?"
    with duckdb.connect(str(db_path), read_only=True) as con:
        row = con.execute(sql, [run_like]).fetchone()
    assert row is not None
    return Stored(int(row[0]), int(row[1]))


def pin_agent_thread(cpu: int) -> None:
    """This process's agent thread (``trainvigil-agent``) onto ``cpu``; the training's threads stay where they are."""
    (thread,) = [t for t in threading.enumerate() if t.name == "trainvigil-agent"]
    assert thread.native_id is not None
    os.sched_setaffinity(thread.native_id, {cpu})


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` onto ``cpus`` (threads it starts later inherit their creator's)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task), cpus)
