"""A real nats-server cluster on loopback for the cluster tests and bench: routes, JetStream, shard mappings.

Each node is its own ``nats-server`` process with a JSON configuration (nats-server reads JSON as its
own format): a client port, a cluster port with routes to every other node, a JetStream store of its
own, and the subject mappings that partition runs over ``shards`` daemon shards
(``trainvigil.schemas.shards.partition_mappings``). A node can be SIGKILLed and started again on the
same ports and store, as a crashed pod comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import nats
import nats.errors

from trainvigil.daemon.broker.embedded import find_binary, free_port
from trainvigil.schemas.shards import partition_mappings

from .wait import wait_until


def _since(path: Path, offset: int) -> str:
    """What ``path`` holds past ``offset``: one start's part of a node's log."""
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


class NatsCluster:
    """``nodes`` nats-server processes clustered over loopback routes, with JetStream and shard mappings."""

    def __init__(self, root: Path, nodes: int = 3, shards: int = 2, name: str = "vigil") -> None:
        self.root = root
        self.name = name
        self.shards = shards
        self.client_ports = [free_port() for _ in range(nodes)]
        self.route_ports = [free_port() for _ in range(nodes)]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * nodes

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.client_ports]

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated: what agents and daemons are given."""
        return ",".join(self.urls)

    def _config(self, i: int) -> Path:
        routes = [f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.route_ports) if j != i]
        config = {
            "server_name": f"n{i}",
            "host": "127.0.0.1",
            "port": self.client_ports[i],
            "jetstream": {"store_dir": str(self.root / f"n{i}" / "js")},
            "mappings": partition_mappings(self.shards),
        }
        if len(self.client_ports) > 1:  # one node: a plain server (a cluster of one would wait for peers)
            config["cluster"] = {"name": self.name, "host": "127.0.0.1", "port": self.route_ports[i], "routes": routes}
        path = self.root / f"n{i}.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))
        return path

    def start_node(self, i: int, tries: int = 3) -> None:
        """Start node ``i`` and wait until it listens.

        Its ports were free when picked, but anything may bind them meanwhile (an outgoing
        connection's ephemeral port included): a node that exits because a port is taken gets new
        ones (its peers route to it, so the mesh still forms) and starts again, up to ``tries`` times.
        """
        for _ in range(tries):
            process, said = self._launch(i)
            if process.poll() is None:
                return
            self.processes[i] = None
            if "address already in use" not in said():
                break
            self.client_ports[i], self.route_ports[i] = free_port(), free_port()
        raise RuntimeError(f"nats node n{i} exited with {process.returncode}; its log ends:\n{said()[-2000:]}")

    def _launch(self, i: int) -> tuple[subprocess.Popen[bytes], Callable[[], str]]:
        """Node ``i`` started once and awaited until it is ready or has exited; with what it has logged since."""
        config = self._config(i)  # makes the root folder too
        log_path = self.root / f"n{i}.log"
        with log_path.open("ab") as log:  # the child keeps its own descriptor
            since = log.tell()
            process = subprocess.Popen([str(find_binary()), "-c", str(config)], stdout=log, stderr=subprocess.STDOUT)
        self.processes[i] = process
        said = functools.partial(_since, log_path, since)
        # Its own word, not an open port: a port taken by another listener would answer too.
        wait_until(lambda: process.poll() is not None or "Server is ready" in said(), 30, f"nats node n{i} to listen")
        return process, said

    def start(self, timeout: float = 60.0) -> None:
        """Every node, then wait until JetStream has a meta leader (the cluster can create streams).

        A start that fails stops the nodes it started before raising.
        """
        try:
            for i in range(len(self.client_ports)):
                self.start_node(i)
            wait_until(self.jetstream_ready, timeout, "the NATS cluster to elect a JetStream meta leader")
        except BaseException:
            self.stop()
            raise

    def jetstream_ready(self) -> bool:
        async def ask() -> bool:
            nc = await nats.connect(self.urls, connect_timeout=1, max_reconnect_attempts=0, allow_reconnect=False)
            try:
                await nc.jetstream().account_info()
                return True
            finally:
                await nc.close()

        try:
            return asyncio.run(asyncio.wait_for(ask(), 5))
        except (OSError, TimeoutError, nats.errors.Error):
            return False

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (no goodbye to its routes or clients)."""
        process = self.processes[i]
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        self.processes[i] = None

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Every node still running: SIGTERM, then SIGKILL after 10 s."""
        for process in self.processes:
            if process is not None and process.poll() is None:
                process.terminate()
        for i, process in enumerate(self.processes):
            if process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(10)
                if process.poll() is None:
                    process.kill()
                    process.wait()
            self.processes[i] = None
