"""Every way `vigil up`, `sql`, `replay` and `verify` commonly fail: one line on stderr with the documented
exit code, naming the problem, in bounded time; never a traceback, never a silent hang."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from inprocess import InProcessDaemon
from support import NatsServer, free_port, wait_for

from trainvigil.daemon.broker.embedded import supervise
from trainvigil.daemon.store.writer import Store

BOUND_S = 30.0
"""No case may take longer (the unreachable broker waits VIGIL_CONNECT_TIMEOUT_S=2)."""


@dataclass(frozen=True)
class Case:
    argv: list[str]
    code: int
    names: list[str]
    """What the one line must contain: the URL, port, path or key at fault, or what to do."""
    env: dict[str, str] = field(default_factory=dict)


class Setting:
    """What a case needs around it: free or held ports, a broker, a data directory someone holds."""

    def __init__(self, tmp: Path, closed: int, broker: Callable[[], NatsServer]) -> None:
        self.tmp = tmp
        self.closed = closed
        self._broker = broker
        self._cleanups: list[Callable[[], object]] = []

    def held_port(self) -> int:
        """A port another program listens on; it accepts connections and never says a word."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        self._cleanups.append(sock.close)
        return int(sock.getsockname()[1])

    def broker(self) -> str:
        return self._broker().url

    def small_broker(self) -> str:
        """A broker whose JetStream may store 64 MB, far less than the stream's default limit reserves."""
        server = small_broker(self.tmp)
        self._cleanups.append(server.stop)
        return server.url

    def unreachable(self) -> str:
        return f"nats://127.0.0.1:{self.closed}"

    def database(self) -> Path:
        """A data directory with a database and no daemon."""
        data = self.tmp / "data"
        Store(data / "vigil.duckdb").close()
        return data

    def held_database(self) -> Path:
        """A data directory whose database another process holds, as a running daemon does."""
        data = self.database()
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, time; from pathlib import Path; from trainvigil.daemon.store.writer import Store; "
                "store = Store(Path(sys.argv[1])); print('held', flush=True); time.sleep(120)",
                str(data / "vigil.duckdb"),
            ],
            stdout=subprocess.PIPE,
        )

        def stop() -> None:
            holder.kill()
            holder.wait()
            if holder.stdout:
                holder.stdout.close()

        self._cleanups.append(stop)
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        return data

    def close(self) -> None:
        for cleanup in reversed(self._cleanups):
            cleanup()


def small_broker(tmp: Path) -> NatsServer:
    """A started nats-server whose JetStream may store 64 MB in all."""
    conf = _write(tmp / "small-nats.conf", "jetstream {\n  max_file_store: 64MB\n}\n")
    server = NatsServer(tmp / "small-jetstream", config_file=conf)
    server.start()
    return server


def _write(path: Path, data: str | bytes) -> Path:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


CASES: dict[str, Callable[[Setting], Case]] = {
    "up: broker unreachable": lambda s: Case(
        ["up", "--nats", s.unreachable(), "--data-dir", str(s.tmp / "d"), "--http-port", "0"],
        3,
        [s.unreachable(), "within 2 s"],
    ),
    "up: the broker has no room for the stream's limit": lambda s: Case(
        ["up", "--nats", s.small_broker(), "--data-dir", str(s.tmp / "d"), "--http-port", "0"],
        2,
        ["insufficient storage", "10 GiB", "stream.max_bytes", "VIGIL_STREAM_MAX_BYTES"],
    ),
    "up: malformed broker URL": lambda s: Case(["up", "--nats", "garbage", "--data-dir", str(s.tmp)], 2, ["'garbage'"]),
    "up: embedded port held by a program that is not NATS": lambda s: Case(
        ["up", "--embedded-port", str(port := s.held_port()), "--data-dir", str(s.tmp / "d"), "--http-port", "0"],
        2,
        [f"127.0.0.1:{port}", "--embedded-port"],
    ),
    "up: HTTP port in use": lambda s: Case(
        ["up", "--nats", s.broker(), "--data-dir", str(s.tmp / "d"), "--http-port", str(port := s.held_port())],
        2,
        [f"127.0.0.1:{port}", "--http-port"],
    ),
    "up: a daemon holds the data dir": lambda s: Case(
        ["up", "--nats", s.broker(), "--data-dir", str(data := s.held_database()), "--http-port", "0"],
        2,
        [str(data), "--data-dir"],
    ),
    "up: data dir is a file": lambda s: Case(
        ["up", "--data-dir", str(path := _write(s.tmp / "file", "x")), "--http-port", "0"], 2, [str(path)]
    ),
    "up: data dir cannot be created": lambda s: Case(
        ["up", "--data-dir", str(path := _write(s.tmp / "file", "x") / "sub"), "--http-port", "0"], 2, [str(path)]
    ),
    "up: fetch_batch < 1": lambda s: Case(["up"], 2, ["fetch_batch", "-1"], {"VIGIL_FETCH_BATCH": "-1"}),
    "up: port out of range": lambda s: Case(["up", "--http-port", "70000"], 2, ["http_port", "70000"]),
    "up: connect timeout 0": lambda s: Case(["up"], 2, ["connect_timeout_s"], {"VIGIL_CONNECT_TIMEOUT_S": "0"}),
    "sql: a daemon on another broker holds the file": lambda s: Case(
        ["sql", "select 1", "--nats", s.unreachable(), "--data-dir", str(data := s.held_database())],
        3,
        [str(data / "vigil.duckdb"), "--nats", "--config"],
    ),
    "sql: answered from the file, and says so": lambda s: Case(
        ["sql", "select 1", "--nats", s.unreachable(), "--data-dir", str(data := s.database())],
        0,
        [s.unreachable(), f"answered from {data / 'vigil.duckdb'}"],
    ),
    "sql: --config names the broker and data dir": lambda s: Case(
        [
            "sql",
            "select 1",
            "--config",
            str(_write(s.tmp / "vigil.toml", f'nats_url = "{s.unreachable()}"\ndata_dir = "{s.database()}"\n')),
        ],
        0,
        [s.unreachable(), str(s.tmp / "data" / "vigil.duckdb")],
    ),
    "replay: header-only CSV": lambda s: Case(
        ["replay", str(path := _write(s.tmp / "h.csv", "run_id,rank,step,loss\n"))], 2, [str(path), "no rows"]
    ),
    "replay: binary JSON lines": lambda s: Case(
        ["replay", str(path := _write(s.tmp / "b.jsonl", bytes(range(128, 256))))], 2, [str(path), "jsonl"]
    ),
    "replay: no alerts, and says so": lambda s: Case(
        ["replay", str(path := _write(s.tmp / "ok.csv", "run_id,rank,step,loss\nr,0,1,1.0\nr,0,2,0.9\n"))],
        0,
        ["no alerts", str(path)],
    ),
    "verify: missing file": lambda s: Case(
        ["verify", str(path := s.tmp / "missing.pt")], 1, [str(path), "does not exist"]
    ),
    "canary run: a misspelt fault, refused before a daemon starts": lambda s: Case(
        ["canary", "run", "--fault", "nan_gard", "--data-dir", str(s.tmp / "d")],
        2,
        ["unknown fault 'nan_gard'", "did you mean 'nan_grad'?"],
    ),
}


def _closed_ports(n: int) -> list[int]:
    """``n`` distinct ports nothing listens on (all bound at once while chosen, so no two are the same)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass(frozen=True)
class Outcome:
    """A case's process as it ended (``None``: still running at ``BOUND_S``, then killed) and its wall time."""

    case: Case
    done: subprocess.CompletedProcess[str] | None
    took: float


def _run(case: Case, setting: Setting) -> Outcome:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    # Nothing here may touch the default broker port 4222 (a developer's daemon may run there).
    env.update({"VIGIL_CONNECT_TIMEOUT_S": "2", "VIGIL_EMBEDDED_PORT": str(setting.closed), **case.env})
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "trainvigil.daemon.cli", *case.argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=setting.tmp,
            timeout=BOUND_S,
        )
    except subprocess.TimeoutExpired:
        done = None
    return Outcome(case, done, time.monotonic() - started)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    """Every case's ``vigil`` process, each in a setting of its own, as many at once as the machine has cores: most
    of a case's time is its interpreter starting or a connection being refused, and side by side those waits
    overlap; more at once would only make each wait on the others for the CPU, and its bound would time that."""
    servers: list[NatsServer] = []

    def broker() -> NatsServer:
        if not servers:
            servers.append(NatsServer(tmp_path_factory.mktemp("jetstream")))
            servers[0].start()
        return servers[0]

    settings = [Setting(tmp_path_factory.mktemp("case"), closed, broker) for closed in _closed_ports(len(CASES))]
    try:
        cases = [make(setting) for make, setting in zip(CASES.values(), settings, strict=True)]
        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            ended = dict(zip(CASES, pool.map(_run, cases, settings), strict=True))
        yield ended
    finally:
        for setting in settings:
            setting.close()
        for server in servers:
            server.stop()


@pytest.mark.timeout(150)  # the first case runs the module's every CLI (its fixture): ~30 s, more beside other tests
@pytest.mark.parametrize("name", list(CASES))
def test_failure_is_one_line_with_the_documented_exit_code(name: str, outcomes: dict[str, Outcome]) -> None:
    case, done, took = outcomes[name].case, outcomes[name].done, outcomes[name].took
    assert done is not None, f"still running after {BOUND_S:g} s: {case.argv}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == case.code, done.stderr[-3000:]
    # Log lines (JSON: stderr is not a terminal) may come before; the message is the one other line.
    logs = [line for line in done.stderr.splitlines() if line.startswith("{")]
    for line in logs:
        json.loads(line)
    said = [line for line in done.stderr.splitlines() if not line.startswith("{")]
    assert len(said) == 1 and said[0].startswith("vigil"), done.stderr
    for part in case.names:
        assert part in said[0], said[0]
    assert took < BOUND_S


def test_a_smaller_stream_limit_fits_a_broker_with_little_storage(tmp_path: Path) -> None:
    """The way out that the error names: with stream.max_bytes under what the broker may store, the daemon runs
    on that broker and stores what an agent sends."""
    server = small_broker(tmp_path)
    daemon = InProcessDaemon(server.url, tmp_path / "data", env={"VIGIL_STREAM_MAX_BYTES": str(32 * 2**20)})
    try:
        daemon.start()
        env = {**os.environ, "VIGIL_NATS_URL": server.url}
        code = "import trainvigil; a = trainvigil.init(run_id='small'); [a.log(i, loss=1.0) for i in range(20)]; " \
               "assert a.close(timeout=30)"  # fmt: skip
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        wait_for(lambda: daemon.scalar("select count(*) from steps where run_id = 'small'") == 20, 30, "the steps")
    finally:
        daemon.terminate()
        server.stop()


def test_version_prints_the_package_version() -> None:
    from trainvigil import __version__

    done = subprocess.run(
        [sys.executable, "-m", "trainvigil.daemon.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == f"vigil {__version__}", done


def test_stdlib_log_records_come_out_as_the_same_json_lines() -> None:
    """nats-py logs through stdlib logging: its lines are JSON like the daemon's own, not plain text."""
    code = (
        "import logging, structlog; from trainvigil.daemon.logs import configure; configure('json'); "
        "structlog.get_logger().info('ours'); logging.getLogger('nats.aio.client').error('theirs %s', 1); "
        "logging.getLogger('nats.aio.client').info('below warning: dropped')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ours, theirs = (json.loads(line) for line in done.stderr.splitlines())
    assert ours["event"] == "ours" and ours["level"] == "info"
    assert theirs == {**theirs, "event": "theirs 1", "level": "error", "logger": "nats.aio.client"}
    assert set(ours) - {"event"} <= set(theirs), "same keys: level, timestamp"


def test_nats_server_stopped_from_outside_is_info_not_error_and_restarts(tmp_path: Path) -> None:
    async def main() -> list[MutableMapping[str, Any]]:
        with structlog.testing.capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                await tg.start(supervise, free_port(), tmp_path / "js")
                (first,) = [e["pid"] for e in logs if e["event"] == "nats_server_started"]
                os.kill(int(first), signal.SIGTERM)  # nats-server exits 0 on SIGTERM
                with anyio.fail_after(20):
                    while len([e for e in logs if e["event"] == "nats_server_started"]) < 2:
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
        return logs

    logs = anyio.run(main)
    exited = [e for e in logs if e["event"] == "nats_server_exited"]
    assert exited and exited[0]["code"] == 0 and exited[0]["log_level"] == "info", logs
    assert [e["event"] for e in logs][-1] == "nats_server_stopped", "stopped with the task group"
