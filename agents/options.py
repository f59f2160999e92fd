"""Agent settings: keyword arguments first, then ``VIGIL_*`` / torchrun environment, then defaults."""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit

from trainvigil.errors import ConfigError

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
_SCHEMES = {"nats", "tls", "ws", "wss"}


def default_spill_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CACHE_HOME/trainvigil/spill``, else ``~/.cache/trainvigil/spill``: kept across
    reboots (unlike a temp dir), so a run that never reached a broker can be delivered later."""
    cache = env.get("XDG_CACHE_HOME", "")
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"  # the XDG spec ignores relative paths
    return base / "trainvigil" / "spill"


def nats_servers(url: str, key: str = "nats_url (VIGIL_NATS_URL)") -> list[str]:
    """The broker URLs in ``url``, comma-separated, each checked; a bare ``HOST:PORT`` gets ``nats://``.

    Raises:
        ConfigError: a part is not ``nats://``, ``tls://``, ``ws://`` or ``wss://`` with a host and
            (optional) numeric port, nor ``HOST:PORT``; or websocket and plain URLs are mixed.
    """
    servers = []
    for part in (p.strip() for p in url.split(",")):
        full = part if "://" in part else f"nats://{part}"
        try:
            parts = urlsplit(full)
            # Without a scheme a port is required: a lone word is a typo more often than a host name.
            ok = parts.scheme in _SCHEMES and bool(parts.hostname) and parts.port != 0
            ok = ok and (parts.port is not None or full == part)
        except ValueError:  # a port that is not a number, or out of range
            ok = False
        if not ok:
            what = f"is {url!r}" if part == url.strip() else f"{url!r} holds {part!r}"
            raise ConfigError(
                f"{key} {what}, not a NATS URL: use nats://HOST:PORT (or tls://, ws://, wss://, HOST:PORT), "
                "several separated by commas",
                key="nats_url",
            )
        servers.append(full)
    if len({s.startswith(("ws://", "wss://")) for s in servers}) > 1:
        raise ConfigError(f"{key} {url!r} mixes websocket and plain NATS URLs; use one kind", key="nats_url")
    return servers


@dataclass(frozen=True, kw_only=True)
class AgentOptions:
    """Everything an :class:`~trainvigil.agents.Agent` is configured with.

    Attributes:
        run_id: the run every rank of one training job shares.
        rank, local_rank, world_size: as torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``.
        nats_url: the broker (``VIGIL_NATS_URL``): ``nats://``, ``tls://``, ``ws://``, ``wss://`` URLs or
            ``HOST:PORT``, several separated by commas.
        flush_interval: seconds between flushes of buffered steps.
        batch_size: a flush happens early once this many steps are buffered.
        max_buffer: steps held on the training thread's side before ``log()`` drops (counted).
        max_memory_bytes: encoded messages held in memory while the broker is away, then spilled.
        spill_dir: where the append-only spill file goes, and where what is still undelivered at
            exit is kept for the next agent or ``vigil push`` (default :func:`default_spill_dir`).
        max_spill_bytes: the spill file's bound; beyond it messages are dropped (counted).
        heartbeat_interval: seconds between heartbeats.
        ack_timeout: seconds to wait for JetStream to acknowledge a message before resending.
        max_inflight: messages published before waiting for their acknowledgements.
        close_timeout: the deadline ``close()`` gets at interpreter exit.
        enabled: ``False`` (``VIGIL_DISABLED=1``) makes every call a no-op.
        gil: sample GIL contention on a background thread and publish a ``GilSample`` per period.
        gil_interval: seconds per GIL sampling period.
    """

    run_id: str
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    nats_url: str = DEFAULT_NATS_URL
    flush_interval: float = 0.25
    batch_size: int = 8192
    max_buffer: int = 1_000_000
    max_memory_bytes: int = 64 * 2**20
    spill_dir: Path = field(default_factory=default_spill_dir)
    max_spill_bytes: int = 2 * 2**30
    heartbeat_interval: float = 5.0
    ack_timeout: float = 5.0
    max_inflight: int = 32
    close_timeout: float = 10.0
    enabled: bool = True
    gil: bool = False
    gil_interval: float = 1.0
    host: str = field(default_factory=socket.gethostname)

    def __post_init__(self) -> None:
        for name in ("flush_interval", "heartbeat_interval", "ack_timeout", "close_timeout", "gil_interval"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}", key=name)
        for name in ("batch_size", "max_buffer", "max_inflight"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}", key=name)
        if not self.run_id:
            raise ConfigError("run_id must not be empty", key="run_id")
        if self.enabled:  # a disabled agent never connects: its URL cannot stop the run
            nats_servers(self.nats_url)


_ENV_NAMES = {
    "nats_url": "VIGIL_NATS_URL",
    "flush_interval": "VIGIL_FLUSH_INTERVAL",
    "batch_size": "VIGIL_BATCH_SIZE",
    "max_buffer": "VIGIL_MAX_BUFFER",
    "max_memory_bytes": "VIGIL_MAX_MEMORY_BYTES",
    "spill_dir": "VIGIL_SPILL_DIR",
    "max_spill_bytes": "VIGIL_MAX_SPILL_BYTES",
    "heartbeat_interval": "VIGIL_HEARTBEAT_INTERVAL",
    "ack_timeout": "VIGIL_ACK_TIMEOUT",
    "close_timeout": "VIGIL_CLOSE_TIMEOUT",
    "gil": "VIGIL_GIL",
    "gil_interval": "VIGIL_GIL_INTERVAL",
}


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer", key=name) from None


def _convert(name: str, raw: object, key: str) -> object:
    kind = {f.name: f.type for f in fields(AgentOptions)}[name]
    try:
        if kind == "int":
            return int(raw)  # type: ignore[call-overload]
        if kind == "float":
            return float(raw)  # type: ignore[arg-type]
        if kind == "Path":
            return Path(raw)  # type: ignore[arg-type]
        if kind == "bool":
            return raw if isinstance(raw, bool) else str(raw).lower() in {"1", "true", "yes", "on"}
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={raw!r} is not a valid {kind}", key=key) from None
    return raw


def default_run_id(env: Mapping[str, str], world_size: int) -> tuple[str, bool]:
    """A run id when none was given: shared by every rank torchrun started on one node.

    Returns the id and whether it was freshly generated (and should be printed).
    """
    elastic = env.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none":
        return f"torchrun-{elastic}", False
    if world_size > 1:
        # Ranks on one node share their launcher's pid; multi-node jobs should set VIGIL_RUN_ID.
        return f"{socket.gethostname()}-{os.getppid()}", False
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}", True


def resolve(
    run_id: str | None,
    rank: int | None,
    nats_url: str | None,
    overrides: Mapping[str, object],
    env: Mapping[str, str] = os.environ,
) -> tuple[AgentOptions, bool]:
    """Merge arguments, environment and defaults into options.

    Returns the options and whether the run id was generated here.

    Raises:
        ConfigError: an unknown option or a value of the wrong type.
    """
    known = {f.name for f in fields(AgentOptions)}
    unknown = set(overrides) - known
    if unknown:
        raise ConfigError(
            f"unknown agent option(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}",
            key=sorted(unknown)[0],
        )
    world_size = _int_env(env, "WORLD_SIZE", 1)
    values: dict[str, object] = {
        "rank": rank if rank is not None else _int_env(env, "RANK", 0),
        "local_rank": _int_env(env, "LOCAL_RANK", 0),
        "world_size": world_size,
        "enabled": env.get("VIGIL_DISABLED", "") not in {"1", "true", "yes"},
    }
    for name, env_name in _ENV_NAMES.items():
        if env_name in env and env[env_name] != "":
            values[name] = _convert(name, env[env_name], env_name)
    for name, raw in overrides.items():
        values[name] = _convert(name, raw, name)
    if nats_url is not None:
        values["nats_url"] = nats_url
    generated = False
    if run_id is None:
        run_id = env.get("VIGIL_RUN_ID") or None
    if run_id is None:
        run_id, generated = default_run_id(env, world_size)
    values["run_id"] = run_id
    return AgentOptions(**values), generated  # type: ignore[arg-type]


def announce_run_id(run_id: str) -> None:
    """Print a generated run id once, so the user can find the run in SQL."""
    print(f"trainvigil: run_id={run_id} (set VIGIL_RUN_ID to choose it)", file=sys.stderr, flush=True)
