"""Agent settings: keyword arguments first, then ``VIGIL_*`` / torchrun environment, then defaults.

The settings are a msgspec Struct with ``Meta`` limits, read the way the daemon reads its own
(:mod:`trainvigil.schemas.settings`): each field's variable is ``VIGIL_`` + its name upper-cased.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

from trainvigil.errors import ConfigError
from trainvigil.schemas.credentials import BusAccess
from trainvigil.schemas.limits import INT32_MAX, MAX_NAME, Count32, Name, Rank
from trainvigil.schemas.natsurl import parse_nats_url
from trainvigil.schemas.settings import Bytes, Count, Seconds, convert, env_name, from_env
from trainvigil.schemas.subjects import Subjects

from ._values import utf8

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def default_spill_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CACHE_HOME/trainvigil/spill``, else ``~/.cache/trainvigil/spill``: kept across
    reboots (unlike a temp dir), so a run that never reached a broker can be delivered later."""
    cache = env.get("XDG_CACHE_HOME", "")
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"  # the XDG spec ignores relative paths
    return base / "trainvigil" / "spill"


WorldSize = Annotated[int, Meta(ge=1, le=INT32_MAX)]
"""As many ranks as the wire's :data:`~trainvigil.schemas.limits.Rank` can number."""


class _Fields(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The fields of :class:`AgentOptions` and their limits (see there).

    What goes into every envelope's ``Source`` has the wire's own types: a value the daemon would refuse
    (and so dead-letter every message of the run) stops ``init()`` instead."""

    run_id: Annotated[str, Meta(min_length=1, max_length=MAX_NAME)]
    rank: Rank = 0
    local_rank: Count32 = 0
    world_size: WorldSize = 1
    nats_url: str = DEFAULT_NATS_URL
    nats_creds: str = ""
    nats_tls_ca: str = ""
    namespace: str = ""
    flush_interval: Seconds = 1.0
    batch_size: Count = 8192
    max_buffer: Count = 1_000_000
    max_memory_bytes: Bytes = 64 * 2**20
    spill_dir: Path = msgspec.field(default_factory=default_spill_dir)
    max_spill_bytes: Bytes = 2 * 2**30
    heartbeat_interval: Seconds = 5.0
    ack_timeout: Seconds = 5.0
    max_inflight: Count = 32
    retry_wait_initial: Seconds = 0.1
    retry_wait_max: Seconds = 2.0
    close_timeout: Seconds = 10.0
    flush_on_sigterm: bool = False
    enabled: bool = True
    gil: bool = False
    gil_interval: Seconds = 1.0
    redact_argv: bool = True
    host: Name = msgspec.field(default_factory=socket.gethostname)


class AgentOptions(_Fields, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything an :class:`~trainvigil.agents.Agent` is configured with; invalid values raise ``ConfigError``.

    Every field but ``rank``, ``local_rank``, ``world_size``, ``enabled`` and ``host`` is read from
    ``VIGIL_`` + its name upper-cased (``flush_interval`` → ``VIGIL_FLUSH_INTERVAL``); those come
    from torchrun's ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, from ``VIGIL_DISABLED`` and the host.

    Durations are seconds, > 0 and at most :data:`~trainvigil.schemas.settings.MAX_WAIT_S` (a day); sizes
    in bytes at most :data:`~trainvigil.schemas.settings.MAX_BYTES` (1 PiB); counts from 1 to
    :data:`~trainvigil.schemas.settings.MAX_COUNT` (2**31 - 1).

    Attributes:
        run_id: the run every rank of one training job shares (``VIGIL_RUN_ID``; default: torchrun's run
            id, else one generated and printed once): 1 to :data:`~trainvigil.schemas.limits.MAX_NAME`
            (256) characters.
        rank, local_rank, world_size: as torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``: at most the
            wire's 2**31 - 1, and the rank below the world size when that is given (``WORLD_SIZE``, Ray, or
            ``world_size=``; left out, it is 1 and any rank is taken).
        nats_url: the broker: ``nats://``, ``tls://``, ``ws://``, ``wss://`` URLs or ``HOST:PORT``,
            several separated by commas.
        nats_creds: the agent's credentials file (``VIGIL_NATS_CREDS``), for a broker with users:
            ``DATA_DIR/bus/agent.toml`` of ``vigil up --auth``, or what ``vigil auth DIR`` wrote.
            A path, so the secret is never in the environment or on a command line.
        nats_tls_ca: PEM file of the CA that signed the broker's TLS certificate (``VIGIL_NATS_TLS_CA``).
        namespace: the deployment this run reports to on a broker that several share (``VIGIL_NAMESPACE``): its
            daemon's ``namespace``; empty (the default) is the default namespace. 1-32 letters, digits, ``_``
            and ``-``, starting with a letter or digit (see the docs' namespaces guide).
        flush_interval: seconds between flushes of buffered steps, so at most this long before the daemon
            sees a step. Each flush wakes the agent's thread, whose cost is mostly per wake-up (1 s: about
            half the thread's CPU of 0.25 s at 660 steps/s, a third at 10 steps/s).
        batch_size: a flush happens early once this many steps are buffered.
        max_buffer: steps held on the training thread's side before ``log()`` drops (counted).
        max_memory_bytes: encoded messages held in memory until acknowledged, then spilled; while the
            broker is away, messages go to the spill file at once (memory only when it cannot be written).
        spill_dir: where the append-only spill file goes, and where what is still undelivered at
            exit is kept for the next agent or ``vigil push`` (default :func:`default_spill_dir`).
        max_spill_bytes: the spill file's bound; beyond it messages are dropped (counted).
        heartbeat_interval: seconds between heartbeats.
        ack_timeout: seconds to wait for JetStream to acknowledge a message before resending.
        max_inflight: messages published before waiting for their acknowledgements.
        retry_wait_initial, retry_wait_max: an unacknowledged publish is tried again after
            ``retry_wait_initial`` seconds, doubling up to ``retry_wait_max``; a broker that is away
            is tried again every :data:`~trainvigil.agents.transport.publisher.RECONNECT_WAIT_S`.
        close_timeout: the deadline ``close()`` gets at interpreter exit.
        flush_on_sigterm: ``SIGTERM`` exits through Python (code 143) so the agent flushes first, and a rank
            stuck in C code still dies of it (see :mod:`._sigterm`); off: ``SIGTERM`` keeps its default action.
        enabled: ``False`` (``VIGIL_DISABLED=1``) makes every call a no-op.
        gil: sample GIL contention on a background thread and publish a ``GilSample`` per period.
        gil_interval: seconds per GIL sampling period.
        redact_argv: mask what looks like a secret in the command line ``run_start`` records (which the
            history keeps): the value of an option named like ``--hf-token``, ``--api_key=``, ``--password``,
            ``--client-secret`` (Hydra's ``db.password=...`` too), known token formats anywhere (``hf_...``,
            ``sk-...``, ``ghp_...``) and a URL's password, each as ``***`` (see
            :func:`~trainvigil.agents._redact.redact_argv`). ``VIGIL_REDACT_ARGV=0`` records it verbatim.
        host: this machine's name, at most 256 characters.
    """

    def __post_init__(self) -> None:
        # Keyword construction skips msgspec's checks; converting into the plain fields runs them.
        _checked(msgspec.structs.asdict(self), _Fields)
        Subjects(self.namespace)  # a bad namespace stops init() here, naming the setting and the rule
        for key in ("run_id", "host"):  # an undecodable name would fail the encoding of every message
            if not utf8(getattr(self, key)):
                raise ConfigError(f"{key}={_shown(getattr(self, key))} is not UTF-8 text; choose another", key=key)
        if self.enabled:  # a disabled agent never connects: its URL and files cannot stop the run
            parse_nats_url(self.nats_url)
            self.access.connect_options()  # a missing or malformed file is said now, before training starts

    @property
    def subjects(self) -> Subjects:
        """The subjects of this agent's namespace (its data goes on :meth:`~Subjects.data`)."""
        return Subjects(self.namespace)

    @property
    def access(self) -> BusAccess:
        """The credentials and CA this agent connects with."""
        return BusAccess(creds=self.nats_creds, tls_ca=self.nats_tls_ca)


_FROM_TORCHRUN = {"rank": "RANK", "local_rank": "LOCAL_RANK", "world_size": "WORLD_SIZE"}
_NOT_VIGIL_ENV = frozenset({*_FROM_TORCHRUN, "enabled", "host", "run_id"})
_BOOLS = frozenset(f.name for f in msgspec.structs.fields(_Fields) if f.type is bool)
_TRUE = frozenset({"1", "true", "yes", "on"})
T = TypeVar("T", bound=msgspec.Struct)


def _checked(values: Mapping[str, Any], struct: type[T], names: Mapping[str, str] | None = None) -> T:
    """``values`` converted into ``struct``; a bad value is a ConfigError keyed by ``names[field]``, else the field."""
    try:
        return convert(values, struct)
    except msgspec.ValidationError as exc:
        if isinstance(exc.__cause__, ConfigError):  # a check of __post_init__ that already names its key
            raise exc.__cause__ from None
        problem, _, where = str(exc).rpartition(" - at ")
        field = where.strip("`").removeprefix("$.").split(".")[0].split("[")[0]
        key = (names or {}).get(field, field)
        hint = _HINTS.get(field, "")
        raise ConfigError(f"{key}={_shown(values.get(field))}: {problem or exc}{hint}", key=key) from None


_HINTS = {"run_id": "; choose a shorter one (VIGIL_RUN_ID, init(run_id=...)), hyper-parameters go in init(config=...)"}


def _shown(value: object) -> str:
    """``value`` for a one-line message: a long one clipped, with its length."""
    text = repr(value)
    if len(text) <= 80:
        return text
    return f"{text[:60]}... ({len(value)} characters)" if isinstance(value, str) else f"{text[:60]}..."


@dataclass(frozen=True, slots=True)
class RayWorker:
    """Where this process sits in a Ray Train job (``ray.train.get_context()``)."""

    run_id: str
    rank: int
    local_rank: int
    world_size: int


def ray_worker() -> RayWorker | None:
    """This process's place in a Ray Train job, when it is a Ray Train worker; ``None`` otherwise.

    Ray is never imported here: a worker's training function runs in a process that imported it.
    """
    if "ray.train" not in sys.modules:
        return None
    try:
        context = sys.modules["ray.train"].get_context()
        name = str(context.get_experiment_name() or "")
        return RayWorker(
            run_id=name,
            rank=int(context.get_world_rank()),
            local_rank=int(context.get_local_rank()),
            world_size=int(context.get_world_size()),
        )
    except Exception:  # the driver, or a process outside trainer.fit(): Ray says so by raising
        return None


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
        ConfigError: an unknown option or a value of the wrong type (``key`` names the variable
            when the value came from the environment).
    """
    known = set(AgentOptions.__struct_fields__)
    unknown = set(overrides) - known
    if unknown:
        raise ConfigError(
            f"unknown agent option(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}",
            key=sorted(unknown)[0],
        )
    values = from_env(AgentOptions, env, skip=_NOT_VIGIL_ENV)
    names = {name: env_name((name,)) for name in values}
    for name, variable in _FROM_TORCHRUN.items():
        if env.get(variable, "") != "":
            values[name], names[name] = env[variable], variable
    ray = ray_worker()
    if ray is not None:  # inside a Ray Train worker: its context names the rank and the job
        values.update(rank=ray.rank, local_rank=ray.local_rank, world_size=ray.world_size)
        for name in ("rank", "local_rank", "world_size"):
            names.pop(name, None)
    for name in _BOOLS & values.keys():
        values[name] = values[name].lower() in _TRUE
    values["enabled"] = env.get("VIGIL_DISABLED", "").lower() not in _TRUE
    for name, raw in overrides.items():
        values[name] = raw
        names.pop(name, None)
    if rank is not None:
        values["rank"] = rank
        names.pop("rank", None)
    if nats_url is not None:
        values["nats_url"] = nats_url
        names.pop("nats_url", None)
    if run_id is None and env.get("VIGIL_RUN_ID"):
        run_id, names["run_id"] = env["VIGIL_RUN_ID"], "VIGIL_RUN_ID"
    if run_id is None:
        run_id = (ray.run_id if ray is not None else "") or None
    values["run_id"] = "-" if run_id is None else run_id  # the default depends on the world size, checked first
    options = _checked(values, AgentOptions, names)
    if "world_size" in values and options.rank >= options.world_size:  # a world size left out takes any rank
        rank_key, world_key = names.get("rank", "rank"), names.get("world_size", "world_size")
        raise ConfigError(
            f"{rank_key}={options.rank} is not below {world_key}={options.world_size}: ranks run from 0 to "
            "the world size - 1; set both as the launcher does",
            key=rank_key,
        )
    if run_id is not None:
        return options, False
    run_id, generated = default_run_id(env, options.world_size)
    return msgspec.structs.replace(options, run_id=run_id), generated


def announce_run_id(run_id: str) -> None:
    """Print a generated run id once, so the user can find the run in SQL."""
    print(f"trainvigil: run_id={run_id} (set VIGIL_RUN_ID to choose it)", file=sys.stderr, flush=True)
