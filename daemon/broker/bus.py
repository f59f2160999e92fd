"""How secure the daemon's bus is: auth and TLS of the embedded broker, and the daemon's own access.

Auth is on by default whenever the bundled nats-server listens beyond loopback, and off on
loopback (the default, ``127.0.0.1``): there ``vigil up`` and ``python train.py`` on one machine
work with no setup, and only processes on that machine reach the broker. On a machine shared with
people you do not trust, turn it on there too (``vigil up --auth``, ``embedded_auth = "on"``); the
agents then need ``VIGIL_NATS_CREDS``, which the ready line names.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

from trainvigil.daemon.broker.auth import credentials_file, prepare
from trainvigil.daemon.broker.embedded import dial_host
from trainvigil.daemon.config import DaemonConfig
from trainvigil.schemas.credentials import BusAccess


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def auth_dir(config: DaemonConfig) -> Path:
    """Where the embedded broker's users live: ``DATA_DIR/bus``."""
    return Path(config.data_dir) / "bus"


def embedded_auth(config: DaemonConfig) -> bool:
    """Whether the bundled nats-server requires credentials (see the module's docstring)."""
    if config.embedded_auth == "auto":
        return not is_loopback(config.embedded_host)
    return config.embedded_auth == "on"


@dataclass(frozen=True)
class EmbeddedSetup:
    """What :func:`~trainvigil.daemon.broker.embedded.supervise` starts with: its config file and URL scheme."""

    config_file: Path | None
    scheme: str


def embedded_setup(config: DaemonConfig) -> EmbeddedSetup:
    """Write the bundled nats-server's configuration when it has users or TLS (users once, at first start).

    Raises:
        ConfigError: the credentials directory cannot be written or read.
    """
    import structlog  # here, not with the module: the reading commands import it for access() alone

    log = structlog.get_logger("trainvigil.nats")
    auth = embedded_auth(config)
    # Absolute: nats-server resolves relative paths against its own working directory.
    cert, key = Path(config.embedded_tls_cert).resolve(), Path(config.embedded_tls_key).resolve()
    tls = (cert, key) if config.embedded_tls_cert else None
    open_to = None if is_loopback(config.embedded_host) else config.embedded_host
    if open_to and not auth:
        log.warning("bus_without_auth", host=open_to, note="embedded_auth = off: anyone who reaches it can publish")
    if open_to and tls is None:
        log.warning("bus_without_tls", host=open_to, note="passwords and metrics cross the network in clear text")
    if not auth and tls is None:
        return EmbeddedSetup(None, "nats")
    setup = prepare(auth_dir(config), tls, users=auth, subjects=config.subjects)
    return EmbeddedSetup(setup, "tls" if tls else "nats")


def access(config: DaemonConfig, role: str) -> BusAccess:
    """The credentials and CA a process of ``role`` connects with: ``nats_creds``; else, on the embedded
    broker's machine (no ``nats_url``), that role's file under ``DATA_DIR/bus`` once auth wrote it.

    So ``vigil up --auth`` (which writes them before it connects) and then ``vigil sql`` on the same
    machine need nothing more. A broker without auth ignores credentials it did not ask for.
    """
    creds = config.nats_creds
    local = credentials_file(auth_dir(config), role)
    if not creds and not config.nats_url and local.exists():
        creds = str(local)
    return BusAccess(creds=creds, tls_ca=config.nats_tls_ca)


def agents_hint(config: DaemonConfig) -> str:
    """What the ready line adds for agents of the embedded broker: its name for other hosts, their credentials."""
    if config.nats_url:
        return ""
    host = config.embedded_host
    if not is_loopback(host):  # the daemon dials loopback; other machines need a name they can reach
        host = socket.gethostname() if dial_host(host) == "127.0.0.1" else host
        where = f" (from other hosts: {host}:{config.embedded_port})"
    else:
        where = ""
    if not embedded_auth(config):
        return where
    directory = auth_dir(config).resolve()
    return (
        f"{where} with VIGIL_NATS_CREDS={credentials_file(directory, 'agent')} (copy it, mode 0600, to the "
        f"training hosts; readers: {credentials_file(directory, 'reader')})"
    )
