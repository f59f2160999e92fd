"""Test helpers: a real nats-server on a free port, the daemon as a real process, waiting on conditions."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainvigil.daemon.broker.embedded import find_binary, free_port, port_open, server_args
from trainvigil.daemon.cli.sqlclient import _ask, _connect, ask_daemon
from trainvigil.schemas.credentials import ANONYMOUS, BusAccess
from trainvigil.schemas.query import QueryRequest, QueryResult
from trainvigil.schemas.shards import ShardId
from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, Subjects, describe_namespace
from trainvigil.testing import (
    wait_until as wait_for,  # the one deadline helper, shared with bench/ (tests call it wait_for)
)

HERE = Path(__file__).parent
"""This folder: the helper scripts the tests run as processes (``producer.py``, ``nan_train.py``, ...)."""
ROOT = HERE.parents[1]
"""The checkout."""
CHILD_OFFSET = 1_000_000


class NatsServer:
    """A real nats-server with JetStream in a temp dir; can be stopped and started again.

    Args:
        monitor: serve nats-server's HTTP monitoring (``/connz``...) on :attr:`monitor_port` too.
    """

    def __init__(self, store_dir: Path, config_file: Path | None = None, *, monitor: bool = False) -> None:
        self.port = free_port()
        self.store_dir = store_dir
        self.config_file = config_file
        self.url = f"nats://127.0.0.1:{self.port}"
        self.monitor_port = free_port() if monitor else None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = server_args(find_binary(), self.port, self.store_dir, config_file=self.config_file)
        if self.monitor_port is not None:
            args += ["-m", str(self.monitor_port)]
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: port_open("127.0.0.1", self.port), 10, "nats-server to listen")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None


class SqlOverNats:
    """What a test asks a daemon over NATS at ``nats_url``, as ``vigil sql`` asks it (never the file: a test must
    not hold the database's lock)."""

    nats_url: str
    access: BusAccess = ANONYMOUS
    """How :meth:`sql` connects."""
    subjects: Subjects = DEFAULT_SUBJECTS
    """The daemon's namespace, where :meth:`sql` asks (set once the daemon is launched)."""

    def sql(self, sql: str) -> QueryResult:
        request = QueryRequest(sql=sql, limit=100_000)
        result = asyncio.run(ask_daemon(self.nats_url, request, 30, self.access, subjects=self.subjects))
        assert result is not None, f"no daemon of {describe_namespace(self.subjects.namespace)} answered"
        assert not result.error, result.error
        return result

    def scalar(self, sql: str) -> Any:
        return self.sql(sql).rows[0][0]


class Daemon(SqlOverNats):
    """``vigil up`` as a real process against a given broker and data directory (the in-process daemon,
    ``inprocess.InProcessDaemon``, starts faster; this one can be killed, signalled and measured apart)."""

    def __init__(self, nats_url: str, data_dir: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.nats_url = nats_url
        self.data_dir = data_dir
        self.env = env or {}
        self.http_port = free_port()
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"{data_dir.name}-daemon.log"

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting for it (:meth:`wait_ready` then): daemons launched side by side
        spend their start-up at the same time."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "VIGIL_QUERY_ROW_LIMIT": "100000", **self.env}
        self.subjects = Subjects(env.get("VIGIL_NAMESPACE", ""))  # the namespace of the environment it is given
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trainvigil.daemon.cli",
                    "up",
                    *self.broker_args(),
                    "--data-dir",
                    str(self.data_dir),
                    "--http-port",
                    str(self.http_port),
                    *self.extra,
                ],
                stdout=log,
                stderr=log,
                env=env,
            )

    def wait_ready(self) -> None:
        wait_for(self._answers, 30, "the daemon to answer queries")

    def broker_args(self) -> list[str]:
        return ["--nats", self.nats_url]

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"daemon exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
        try:
            self.sql("select 1")
            return True
        except Exception:
            return False

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


def terminate_together(*daemons: Daemon) -> list[int]:
    """SIGTERM to every daemon, then their exit codes: they drain and commit side by side."""
    for d in daemons:
        assert d.process is not None
        d.process.send_signal(signal.SIGTERM)
    return [d.process.wait(30) for d in daemons if d.process is not None]


class SecuredDaemon(Daemon):
    """``vigil up --auth``: the bundled nats-server on a free port with the users and permissions it
    writes under ``DATA_DIR/bus``; :meth:`sql` asks as the reader (trusting ``tls_ca`` when given)."""

    def __init__(self, data_dir: Path, *extra: str, env: dict[str, str] | None = None, tls_ca: Path | None = None):
        port = free_port()
        url = f"{'tls' if tls_ca else 'nats'}://127.0.0.1:{port}"
        super().__init__(url, data_dir, "--auth", "--embedded-port", str(port), *extra, env=env)
        self.access = BusAccess(creds=str(self.creds("reader")), tls_ca=str(tls_ca or ""))

    def broker_args(self) -> list[str]:
        return []  # the bundled broker

    def creds(self, role: str) -> Path:
        """The credentials file of ``role`` (``agent``, ``daemon``, ``reader``) the daemon wrote."""
        return self.data_dir / "bus" / f"{role}.toml"


class ShardDaemon(Daemon):
    """``vigil up --shard I/N``; :meth:`sql` asks this shard alone, on its own subject (as the daemon's
    credentials when ``env`` names them: a test reads what it stored)."""

    def __init__(self, nats_url: str, data_dir: Path, shard: ShardId, env: dict[str, str] | None = None) -> None:
        super().__init__(nats_url, data_dir, "--shard", str(shard), env=env)
        self.shard = shard
        if creds := (env or {}).get("VIGIL_NATS_CREDS"):
            self.access = BusAccess(creds=creds)

    def sql(self, sql: str) -> QueryResult:
        async def ask() -> QueryResult | None:
            conn = await _connect(self.nats_url, self.access)
            assert conn is not None and conn.nc is not None, "no broker answered"
            try:
                subject = self.subjects.shard_query(self.shard.index)  # the shard of the daemon's namespace
                return await _ask(conn, self.nats_url, QueryRequest(sql=sql, limit=100_000), 30, subject)
            finally:
                await conn.nc.close()

        result = asyncio.run(ask())
        assert result is not None, f"shard {self.shard} does not answer"
        assert not result.error, result.error
        return result


class AuthBroker(NatsServer):
    """A nats-server running the configuration that ``vigil auth ROOT/bus AUTH_ARGS`` wrote (users,
    permissions, and with ``--shards`` the mappings); :meth:`creds` names a user's file there."""

    def __init__(self, root: Path, *auth_args: str) -> None:
        self.auth_dir = root / "bus"
        done = vigil("auth", str(self.auth_dir), *auth_args, timeout=60)
        assert done.returncode == 0, done.stderr
        super().__init__(root / "jetstream", self.auth_dir / "nats-server.conf")

    def creds(self, user: str) -> Path:
        """The credentials file of ``user`` (a role, or ``agent-TEAM``) that ``vigil auth`` wrote."""
        return self.auth_dir / f"{user}.toml"


@contextmanager
def secured_shard(root: Path, *auth_args: str) -> Iterator[tuple[AuthBroker, ShardDaemon]]:
    """A broker with users and one shard's mappings (``vigil auth ROOT/bus --shards 1 AUTH_ARGS``) and that
    shard (``vigil up --shard 0/1`` with the daemon's credentials), for a module-scoped fixture."""
    broker = AuthBroker(root, "--shards", "1", *auth_args)
    broker.start()
    daemon = ShardDaemon(
        broker.url, root / "data", ShardId(0, 1), env={"VIGIL_NATS_CREDS": str(broker.creds("daemon"))}
    )
    try:
        daemon.start()
        yield broker, daemon
        daemon.terminate()
    finally:
        broker.stop()


@contextmanager
def serving(root: Path, env: dict[str, str] | None = None, *, args: Sequence[str] = ()) -> Iterator[Daemon]:
    """A nats-server and a daemon (``env``: more variables for it, ``args``: more ``vigil up`` arguments) of
    their own under ``root``, for a module-scoped fixture whose tests only read what the daemon holds; both
    are stopped at the end."""
    server = NatsServer(root / "jetstream")
    server.start()
    daemon = Daemon(server.url, root / "data", *args, env=env)
    try:
        daemon.start()
        yield daemon
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.kill()
        server.stop()


def run_producer(
    nats_url: str, run_id: str, rank: int, steps: int, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``tests/_support/producer.py`` as a separate training process (``env``: more variables for it)."""
    # The child imports this module, so it gets the import path pytest gives the tests (``pythonpath``).
    path = os.pathsep.join(filter(None, [str(HERE), str(ROOT / "bench"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "VIGIL_NATS_URL": nats_url, "PYTHONPATH": path, **(env or {})}
    return subprocess.Popen(
        [sys.executable, str(HERE / "producer.py"), run_id, str(rank), str(steps), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def vigil(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``vigil ARGS`` as a real process (its exit code is the one a shell sees); ``env``: its whole environment."""
    command = [sys.executable, "-m", "trainvigil.daemon.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def vigil_together(*commands: Sequence[str], timeout: float = 120) -> list[subprocess.CompletedProcess[str]]:
    """:func:`vigil` for each of ``commands``, started at once and awaited together (each process spends
    about a second importing; side by side those seconds overlap); the results in the order given."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda args: vigil(*args, timeout=timeout), commands))


def expected_loss(rank: int, step: int) -> float:
    """The loss producer.py logs: awkward floats, so an exact round trip means something."""
    return (step + 1) / 3.0 + rank * 1e-7 + 1.0 / (step + 7)


def finish(proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Wait for a producer and require a clean exit (every event delivered)."""
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-2000:]


def turned_away(caplog: Any, run_id: str, steps: int, **options: Any) -> tuple[str, Path]:
    """An in-process agent (``options`` to ``trainvigil.init``) that the broker turns away: it logs ``steps``
    steps without raising, ``close()`` says False, and it says why in one line. Returns that line and the
    file its steps were kept in (``caplog``: pytest's fixture, at WARNING for ``trainvigil.agent``)."""
    import trainvigil

    agent = trainvigil.init(run_id=run_id, flush_interval=0.05, **options)
    for step in range(steps):
        agent.log(step, loss=expected_loss(0, step))
    assert agent.close(timeout=2) is False
    lines = [r.getMessage() for r in caplog.records if r.name == "trainvigil.agent"]
    said = [line for line in lines if "turned this agent away" in line]  # the other line: where data was kept
    assert len(said) == 1 and "\n" not in said[0], lines
    assert not [line for line in lines if "no broker answers" in line], lines
    kept = Path(agent.stats()["kept_file"])
    assert kept.is_file()
    return said[0], kept


def stat_fields(pid: int, thread: int | None = None) -> list[str]:
    """The fields of ``/proc/PID/stat`` (or of one of its threads') after the command name (state, ppid, ...)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    return Path(path).read_text().rsplit(")", 1)[1].split()


def gone(pid: int) -> bool:
    """No such process, or only its zombie waiting for whoever adopted it.

    A zombie leader is not enough: a killed multi-threaded process (nats-server's Go runtime) shows ``Z`` for its
    leader while its other threads are still exiting, and those still hold its sockets open. Gone is when every
    thread, the leader among them, is a zombie or has left.
    """
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return True
    for thread in threads:
        try:
            if stat_fields(pid, int(thread))[0] != "Z":
                return False
        except (FileNotFoundError, ProcessLookupError):
            continue
    return True
    for tid in threads:
        try:
            if Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                return False
        except (FileNotFoundError, ProcessLookupError):
            continue
    return True
