"""Daemon configuration: defaults < TOML file < ``VIGIL_*`` environment < command-line flags.

Every key has an environment name: ``VIGIL_`` + the dotted key upper-cased with ``.``
turned into ``_`` (``stream.max_age_s`` → ``VIGIL_STREAM_MAX_AGE_S``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from trainvigil.daemon.detectors import DetectorsConfig
from trainvigil.errors import ConfigError
from trainvigil.schemas.canaries import CLEAN, FAULT_KINDS, SCRIPT_FAULTS, WORKLOADS
from trainvigil.schemas.natsurl import parse_nats_url
from trainvigil.schemas.settings import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_RETENTION_S,
    MAX_WAIT_S,
    convert,
    env_name,
    field_type_at,
    from_env,
    path_steps,
    set_path,
)
from trainvigil.schemas.shards import MAX_SHARDS, ShardId, parse_shard
from trainvigil.schemas.subjects import STREAM, Subjects

_NATS_URL_KEY = "nats_url (VIGIL_NATS_URL, --nats)"
QUERY_ROW_LIMIT = 10_000
"""``query_row_limit``'s default: rows one answer holds unless the request names fewer (or ``--limit`` more)."""


def _must(key: str, rule: str, value: object) -> ConfigError:
    """The error of a setting that breaks its rule: ``KEY (VARIABLE) must be RULE, not VALUE``."""
    env = env_name(tuple(key.split(".")))
    return ConfigError(f"{key} ({env}) must be {rule}, not {value!r}", key=key)


def _require(key: str, value: object, rule: str, ok: bool) -> None:
    """A rule that no field's ``Meta`` can say (one across settings, or a value parsed): checked after decoding.

    A ``ConfigError`` is a ``ValueError``, which msgspec turns into a ValidationError naming where it was.
    """
    if not ok:
        raise _must(key, rule, value)


def _within(key: str, value: float, least: float, most: float, unset: float) -> None:
    """``least <= value <= most``, or ``value == unset`` (the setting's "no limit" or "default" value)."""
    rule = f"a number >= {least:.0f} and <= {most:.0f}, or {unset:.0f}"
    _require(key, value, rule, value == unset or (math.isfinite(value) and least <= value <= most))


# Per-field limits, as msgspec checks them when it decodes; the description is the rule an error states.
_Wait = Annotated[float, Meta(gt=0, le=MAX_WAIT_S, description=f"a number > 0 and <= {MAX_WAIT_S:.0f}")]
"""A duration in seconds: > 0 and at most a day (:data:`~trainvigil.schemas.settings.MAX_WAIT_S`)."""
_Pause = Annotated[float, Meta(ge=0, le=MAX_WAIT_S, description=f"a number >= 0 and <= {MAX_WAIT_S:.0f}")]
"""A duration in seconds that may be 0: at most a day."""
_Count = Annotated[int, Meta(ge=1, le=MAX_COUNT, description=f"a number >= 1 and <= {MAX_COUNT}")]
"""A count from 1 to :data:`~trainvigil.schemas.settings.MAX_COUNT`."""
_Size = Annotated[int, Meta(ge=1, le=MAX_BYTES, description=f"a number >= 1 and <= {MAX_BYTES}")]
"""Bytes, from 1 to :data:`~trainvigil.schemas.settings.MAX_BYTES` (1 PiB)."""
_Host = Annotated[str, Meta(pattern=r"\S", description="a host name or address")]
_Buckets = Annotated[int, Meta(ge=1, le=100_000, description="a number >= 1 and <= 100000")]
"""A query rate limiter's burst and askers: at most 100 000."""
_Name = Annotated[
    # JetStream names: no whitespace, no subject tokens (. * >), no path separators.
    str,
    Meta(pattern=r"^[^\s.*>/\\]+\Z", description="a name without spaces, '.', '*', '>', '/'"),
]


@functools.cache
def _limited(struct: type[msgspec.Struct]) -> tuple[tuple[str, Any], ...]:
    """The fields of ``struct`` whose type carries a ``Meta`` limit, with that type."""
    return tuple((f.name, f.type) for f in msgspec.structs.fields(struct) if _rule_of(f.type) is not None)


def _rule_of(field_type: Any) -> str | None:
    """The rule in words of a field type's ``Meta`` (its description), or ``None`` when it has none."""
    if get_origin(field_type) is not Annotated:
        return None
    return next((m.description for m in get_args(field_type)[1:] if isinstance(m, Meta) and m.description), None)


def _check_limits(settings: msgspec.Struct, table: str = "") -> None:
    """The ``Meta`` limits of ``settings``' fields, checked again: msgspec checks them when it decodes, not when a
    Struct is built by keyword (in code, or a test), which is held to the same limits here.

    Args:
        table: the dotted key of ``settings``' table (``stream``, ``canary.jobs``); ``""`` at the top.
    """
    for name, field_type in _limited(type(settings)):
        value = getattr(settings, name)
        try:
            msgspec.convert(value, field_type)
        except msgspec.ValidationError:
            raise _must(f"{table}.{name}" if table else name, str(_rule_of(field_type)), value) from None


_WHERE = re.compile(r" - at `(?P<path>\$[^`]*)`$")


def _decode_error(exc: msgspec.ValidationError, tree: Mapping[str, Any]) -> tuple[str, str | None]:
    """msgspec's error as a setting's: the message and the dotted key it names (``None``: no one key).

    A rule of a ``Meta`` reads as a check's does (``KEY (VARIABLE) must be RULE, not VALUE``); a check's own
    error (``_require``) and a wrong type keep msgspec's words, where it was included.
    """
    if isinstance(exc.__cause__, ConfigError):  # a check after decoding: its message names the key already
        return str(exc), exc.__cause__.key
    found = _WHERE.search(str(exc))
    if found is None:
        return str(exc), None
    steps = path_steps(found["path"])
    key = ".".join(name for name, _ in steps if name)
    problem = str(exc)[: found.start()]
    field_type, value = field_type_at(DaemonConfig, found["path"]), _given_at(tree, steps)
    rule = _rule_of(field_type)
    if rule is None or ", got " in problem or not problem.startswith("Expected"):
        return str(exc), key or None
    base = get_args(field_type)[0]
    with contextlib.suppress(msgspec.ValidationError):  # shown as the check sees it: "1e300" from the environment
        value = msgspec.convert(value, base, strict=False)
    which = f" - at `{found['path']}`" if any(index for _, index in steps) else ""  # the item of a list
    return f"{_must(key, rule, value)}{which}", key


def _given_at(tree: Any, steps: list[tuple[str, str]]) -> Any:
    """The value given at ``steps`` (:func:`~trainvigil.schemas.settings.path_steps`) of the settings ``tree``."""
    for name, index in steps:
        if index:
            tree = tree[int(index)] if isinstance(tree, list) and int(index) < len(tree) else None
        else:
            tree = tree.get(name) if isinstance(tree, Mapping) else None
    return tree


def _nats_url(url: str) -> None:
    """One URL or several comma-separated (a cluster's nodes), read as the agent and every command read it."""
    parse_nats_url(url, _NATS_URL_KEY)


def nats_servers(url: str) -> list[str]:
    """The broker URLs in ``nats_url`` (comma-separated: a cluster's nodes), in the order given, as nats-py takes
    them (see :func:`~trainvigil.schemas.natsurl.parse_nats_url`).

    Raises:
        ConfigError: ``url`` is not a NATS URL, nor several comma-separated.
    """
    return list(parse_nats_url(url, _NATS_URL_KEY).servers)


_SECRET = re.compile(r"[\x21-\x7e]+")
"""Printable ASCII without spaces: what a bearer token and a base64 key are made of, and safe in a header."""


def read_secret(key: str, path: str) -> str:
    """The secret in the file at ``path``, which the setting ``key`` (e.g. ``http_token_file``) names.

    Secrets come from files only: a value on the command line or in a variable shows in ``ps`` and
    ``/proc/PID/environ`` to every process of the user. Surrounding whitespace (an editor's
    trailing newline) is dropped. Read at start-up, so a missing file stops ``vigil up`` at once.

    Raises:
        ConfigError: the file cannot be read, is empty, or holds more than printable ASCII without
            spaces; the message names ``key`` and ``path``, never the file's contents.
    """
    where = f"{key} ({env_name(tuple(key.split('.')))}): {path}"
    try:
        secret = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        problem = f"cannot be read ({exc.strerror or exc})" if isinstance(exc, OSError) else "is not ASCII text"
        raise ConfigError(f"{where} {problem}; point it at a file holding the secret alone", key=key) from None
    if not _SECRET.fullmatch(secret):
        raise ConfigError(f"{where} must hold one secret of printable ASCII without spaces", key=key)
    return secret


class StreamConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The JetStream stream and the daemon's durable consumer.

    Attributes:
        name: the stream's name (a shard's is ``<name>-<INDEX>``); left at ``VIGIL`` in a ``namespace`` N,
            the stream is ``VIGIL_N``.
        consumer: the daemon's durable consumer (a shard's is ``<consumer>-<INDEX>``).
        duplicate_window_s: JetStream drops a message whose ``Nats-Msg-Id`` it stored this recently
            (an agent's resend); older resends are stored once by the daemon itself.
        max_bytes, max_age_s: the stream's limits. It holds what the daemon has not committed
            yet (committed messages are purged, see ``purge_committed``).
        discard: what a full stream does. ``new`` (default): it refuses new messages, the agents
            keep them (memory, then spill file) and retry — back-pressure, nothing lost.
            ``old``: it evicts the oldest, which the daemon records as ``data_loss`` (evicted).
        max_msgs_per_subject: one run's kind (``vigil.v1.<run>.metrics``) holds at most this
            many uncommitted messages (-1: no limit); with ``discard = "new"`` a flooding run
            is refused before it can fill the stream for every other run.
        purge_committed: the daemon purges the messages it has committed (DuckDB is the history).
        ack_wait_s: a message delivered but not acked this long is delivered again.
        replicas: copies of the stream the NATS cluster keeps (1-5; 3 in a 3-node cluster, so the
            loss of one node loses nothing and stops nothing). Applied when the daemon creates the
            stream, and raised or lowered on an existing one (nats-server moves the data).
    """

    name: _Name = STREAM
    max_age_s: Annotated[  # 0: no age limit
        float, Meta(ge=0, le=MAX_RETENTION_S, description=f"a number >= 0 and <= {MAX_RETENTION_S:.0f}")
    ] = 7 * 86400.0
    max_bytes: int = 10 * 2**30
    duplicate_window_s: _Wait = 120.0
    consumer: _Name = "vigil-daemon"
    ack_wait_s: _Wait = 300.0
    discard: Literal["new", "old"] = "new"
    max_msgs_per_subject: int = 100_000
    purge_committed: bool = True
    replicas: Annotated[int, Meta(ge=1, le=5, description="an integer from 1 to 5")] = 1

    def __post_init__(self) -> None:
        _check_limits(self, "stream")
        _within("stream.max_bytes", self.max_bytes, 1, MAX_BYTES, unset=-1)  # -1: no limit
        # JetStream refuses a window longer than it keeps messages.
        window_ok = self.max_age_s == 0 or self.duplicate_window_s <= self.max_age_s
        _require("stream.duplicate_window_s", self.duplicate_window_s, "<= stream.max_age_s", window_ok)
        _within("stream.max_msgs_per_subject", self.max_msgs_per_subject, 1, MAX_COUNT, unset=-1)


class StoreConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The DuckDB history.

    Attributes:
        min_free_bytes: below this much free space on the data directory's disk the daemon
            pauses ingest (nothing is acked, the stream keeps it), so queries and DuckDB's
            checkpoint still have room; it resumes by itself when space returns. 0: no floor
            (a write that finds the disk full still pauses, never fails).
        memory_limit_bytes: DuckDB's memory (its buffer pool, inserts and queries together);
            a query that needs more spills to the temp directory or fails with an
            out-of-memory answer, and ingest waits for the memory instead of losing anything.
            0: DuckDB's default (80% of the machine's memory).
    """

    min_free_bytes: Annotated[int, Meta(ge=0, le=MAX_BYTES, description=f"a number >= 0 and <= {MAX_BYTES}")] = (
        256 * 2**20
    )
    memory_limit_bytes: int = 128 * 2**20

    def __post_init__(self) -> None:
        _check_limits(self, "store")
        _within("store.memory_limit_bytes", self.memory_limit_bytes, 32 * 2**20, MAX_BYTES, unset=0)  # 0: DuckDB's


def _http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number or out of range
        return False


class AlertsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where alerts go besides NATS, DuckDB and the log.

    Attributes:
        webhook_url: ``http(s)://`` URL that gets a JSON POST per alert update (Slack-compatible
            body); empty: no webhook. The only URL ever called: redirects are not followed.
        webhook_secret_file: a file holding the HMAC-SHA256 key the posts are signed with (Standard
            Webhooks: ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``); empty: unsigned.
        webhook_token_file: a file holding a bearer token sent as ``Authorization``; empty: none.
        timeout_s: one POST (connect, send, status line) gives up after this long.
        retries: further attempts after a failed one (connection error, timeout, 5xx, 408, 429).
        backoff_s: wait before the first retry; doubled for each later one, up to ``backoff_max_s``.
        backoff_max_s: the longest wait between two retries.
        queue_size: updates waiting for the webhook; past it one is dropped and counted (a warning before any
            page, the oldest of the run holding the most; one place per episode, its newest update).
        drain_s: on shutdown, queued updates get this long to go out.
    """

    webhook_url: str = ""
    webhook_secret_file: str = ""
    webhook_token_file: str = ""
    timeout_s: _Wait = 5.0
    retries: Annotated[int, Meta(ge=0, le=MAX_COUNT, description=f"a number >= 0 and <= {MAX_COUNT}")] = 3
    backoff_s: _Pause = 1.0
    backoff_max_s: _Pause = 30.0
    queue_size: _Count = 1000
    drain_s: _Pause = 5.0

    def __post_init__(self) -> None:
        if self.webhook_url and not _http_url(self.webhook_url):
            # The value is not repeated: a webhook URL often holds a secret (Slack's path does).
            raise ValueError(
                "alerts.webhook_url (VIGIL_ALERTS_WEBHOOK_URL) must be an http:// or https:// URL with a host"
            )
        _check_limits(self, "alerts")
        _require(
            "alerts.backoff_max_s",
            self.backoff_max_s,
            "a number >= alerts.backoff_s",
            self.backoff_max_s >= self.backoff_s,
        )


_INTERVAL = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)\s*")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_interval(text: str) -> float | None:
    """``30m``, ``90s``, ``1.5h``, ``7d``, ``500ms`` in seconds; ``None`` when ``text`` is not one."""
    match = _INTERVAL.fullmatch(text)
    return float(match.group(1)) * _UNIT_S[match.group(2)] if match else None


def _every(key: str, text: str) -> None:
    interval = parse_interval(text)
    if interval is not None:
        _require(key, text, f"an interval > 0 and <= {MAX_RETENTION_S:.0f} s", 0 < interval <= MAX_RETENTION_S)
        return
    from croniter import croniter  # only for a cron expression

    rule = "an interval like 30m, 90s, 2h, or a cron expression like '*/30 * * * *'"
    _require(key, text, rule, croniter.is_valid(text))


def _names(value: str | list[str]) -> tuple[str, ...]:
    """A list from TOML, or a comma-separated string (the environment's form)."""
    items = value.split(",") if isinstance(value, str) else value
    return tuple(item.strip() for item in items if item.strip())


def _kinds(key: str, kinds: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    unknown = [k for k in kinds if k not in allowed]
    _require(key, ", ".join(unknown), f"fault kinds among {', '.join(allowed)} (or all)", not unknown)


class CanaryJob(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A canary of your own (``[[canary.jobs]]``): a training command and the faults to try on it.

    Attributes:
        name: how verdicts and ``vigil canary run --workload`` name it.
        command: run as is (split like a shell would, no shell), in ``cwd``, with ``env`` added;
            it must call ``trainvigil.init()`` and ``trainvigil.torch.watch()`` for the faults to apply.
        faults: kinds to try (any of ``trainvigil.faults.KINDS``); empty: all of them.
        fault_step: the step ``VIGIL_FAULT`` names: within the run, after its warm-up.
        cwd: the directory the command runs in; empty: the daemon's.
        env: variables added to the job's environment.
    """

    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]+\Z", description="a name of letters, digits, _ and -")]
    command: Annotated[str, Meta(pattern=r"\S", description="a command line")]
    faults: list[str] = []
    fault_step: Annotated[int, Meta(ge=0, description="an integer >= 0")] = 100
    cwd: str = ""
    env: dict[str, str] = {}

    def __post_init__(self) -> None:
        _check_limits(self, "canary.jobs")
        _kinds("canary.jobs.faults", tuple(self.faults), SCRIPT_FAULTS)

    @property
    def fault_kinds(self) -> tuple[str, ...]:
        return tuple(self.faults) or SCRIPT_FAULTS


class CanaryConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Fault-injection canaries (``[canary]``): small real training jobs that prove the daemon still catches faults.

    Attributes:
        enabled: run the schedule (``vigil canary run`` works either way). On a shard (``shard``) the
            schedule runs canaries whose runs that shard owns, so every shard proves its own detectors.
        every: an interval (``30m``, ``2h``) or a cron expression (``*/30 * * * *``, UTC). A tick while
            ``concurrency`` canaries still run is skipped, never queued.
        faults: the kinds a scheduled canary may get (``all``, or a list / comma-separated kinds).
        fault_probability: a scheduled canary gets one fault with this probability, else runs clean.
        concurrency: canaries running at once, at most (``vigil canary run`` ones wait for a slot).
        timeout_s: a canary still running this long is killed (its process group) and recorded ``error``.
        settle_s: after a canary ends, how long its data may take to be stored before it is judged anyway.
        stop_when_caught: stop a faulted job ``linger_s`` after its detection is settled (its expected detector
            fired, or an alert came before the fault) instead of running it to its end. A job that cannot end
            by itself (``stall``, ``gil``) is stopped then whatever this says.
        linger_s: how long a settled job keeps running, so that another detector paging on the fault is seen.
        nice: the niceness canaries run at (0-19): training beside them goes first.
        workloads: the built-in workloads the schedule takes turns with (``trainvigil.canary``; needs torch).
        jobs: your own canaries, see :class:`CanaryJob`.
        agent_creds: the agent credentials file canaries connect with when the bus has auth; empty:
            ``DATA_DIR/bus/agent.toml`` when the bundled broker wrote it (never the daemon's own file).
        keep_logs: canary logs (``DATA_DIR/canary/<run>.log``, the job's stdout and stderr) kept, newest first.
    """

    enabled: bool = False
    every: str = "30m"
    faults: str | list[str] = "all"
    fault_probability: Annotated[float, Meta(ge=0, le=1, description="a number from 0 to 1")] = 0.5
    concurrency: _Count = 1
    timeout_s: _Wait = 600.0
    settle_s: _Pause = 30.0
    stop_when_caught: bool = True
    linger_s: _Pause = 5.0
    nice: Annotated[int, Meta(ge=0, le=19, description="a niceness from 0 to 19")] = 10
    workloads: str | list[str] = msgspec.field(default_factory=lambda: list(WORKLOADS))
    jobs: list[CanaryJob] = []
    agent_creds: str = ""
    keep_logs: _Count = 200

    def __post_init__(self) -> None:
        _check_limits(self, "canary")
        _every("canary.every", self.every)
        _kinds("canary.faults", self.fault_kinds, FAULT_KINDS)
        unknown = [w for w in self.workload_names if w not in WORKLOADS]
        _require("canary.workloads", ", ".join(unknown), f"workloads among {', '.join(WORKLOADS)}", not unknown)
        names = [job.name for job in self.jobs]
        clash = sorted({n for n in names if names.count(n) > 1 or n in WORKLOADS or n == CLEAN})
        _require("canary.jobs", ", ".join(clash), "jobs with unique names that are not workloads", not clash)

    @property
    def fault_kinds(self) -> tuple[str, ...]:
        kinds = _names(self.faults)
        return FAULT_KINDS if kinds == ("all",) else kinds

    @property
    def workload_names(self) -> tuple[str, ...]:
        return _names(self.workloads)


class DaemonConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything ``vigil up`` is configured with.

    Every setting has an upper bound: durations (``*_s``) at most a day (``MAX_WAIT_S``; ``stream.max_age_s``
    ten years), sizes in bytes at most 1 PiB (``MAX_BYTES``), counts at most 2**31 - 1 (``MAX_COUNT``, see
    :mod:`trainvigil.schemas.settings`); a value past it stops ``vigil up`` with the setting's name.

    Attributes:
        data_dir: where ``vigil.duckdb`` (and the embedded broker's JetStream store) live.
        nats_url: the broker; empty means: use 127.0.0.1:4222 if something answers there,
            else start the bundled ``nats-server`` on that port. A cluster: its nodes' URLs,
            comma-separated (the client connects to one and fails over to the others).
        shard: ``INDEX/COUNT`` (``0/2``): this daemon owns the runs the broker maps to partition INDEX
            of COUNT, in its own stream (``<stream.name>-INDEX``), consumer (``<stream.consumer>-INDEX``)
            and DuckDB file; empty: one daemon owns every run (see docs/operations/cluster.md).
            Needs ``nats_url`` with a broker that partitions (``vigil shards mappings COUNT``).
        namespace: the deployment this daemon serves on a broker that several share: it reads, stores and
            answers only what agents and commands of the same namespace send (subjects ``N.vigil.v1.*``, stream
            ``VIGIL_N``). 1-32 letters, digits, ``_`` and ``-``, starting with a letter or digit; empty (the
            default): the subjects and stream of a daemon without one (see the docs' namespaces guide).
        embedded_port: the port of the bundled ``nats-server`` (and of the broker looked for first).
        embedded_host: the address the bundled ``nats-server`` listens on (``0.0.0.0``: every interface).
        embedded_auth: users and permissions on the bundled ``nats-server`` (``[agent, daemon, reader]``,
            credentials under ``DATA_DIR/bus``): ``auto`` turns them on unless ``embedded_host`` is a
            loopback address, ``on`` always (``vigil up --auth``), ``off`` never (warned about off loopback).
        embedded_tls_cert, embedded_tls_key: PEM files; given both, the bundled ``nats-server`` requires TLS.
        nats_creds: the credentials file this process connects with (``vigil up``: the daemon's,
            default ``DATA_DIR/bus/daemon.toml`` when the bundled broker has auth; ``vigil sql``: a reader's).
        nats_tls_ca: PEM file of the CA that signed the broker's certificate ("" = the system's CAs).
        connect_timeout_s: ``vigil up`` gives up when the broker cannot be reached within this long.
        http_host, http_port: where ``/healthz`` and ``/metrics`` are served (port 0: off).
        http_token_file: a file holding the bearer token every HTTP request but ``/healthz`` must
            carry (``Authorization: Bearer <token>``); empty: none.
        http_allowed_hosts: ``Host`` names the HTTP side answers besides its own addresses, ``localhost``
            and the machine's name (a list, or comma-separated): ``name``, ``.example.com`` (it and every
            subdomain) or ``*`` (any); other names get 421 (a page rebinding its name to the daemon).
        fetch_batch: messages fetched (and committed in one transaction) at a time, at most. A fleet of
            small messages needs many per fetch: 256 drained ~3 200 messages/s of 4 steps, 1 024 ~4 400.
        fetch_max_bytes: bytes one fetch asks for, at most (raised to one message of the broker's
            ``max_payload``); stay well below the broker's ``max_pending`` (64 MiB by default), or
            it cuts the connection as a slow consumer.
        fetch_timeout_s: a fetch waits this long for a first message (then detectors that watch
            silence get a tick).
        query_row_limit: rows a ``vigil sql`` answer holds at most.
        query_timeout_s: a query running longer is interrupted.
        query_max_bytes: encoded rows a ``vigil sql`` answer holds at most; past it the answer is cut.
        query_memory_bytes: a query is interrupted once the daemon's memory grew by this much while it ran; a
            call whose values could pass it within one vector (2 048 rows: ``repeat()``, ``lpad()``, a scalar
            ``range()``...) is refused before it runs.
        query_spill_bytes: a query is interrupted once DuckDB's temp directory grew by this much while it ran.
        query_concurrency: queries running at once; a request beyond that gets a "busy" answer at once.
        query_rate_per_s, query_burst: queries one client connection may ask a second, and at once (a token
            bucket per asker); past them it gets a "busy" answer at once, without DuckDB. At most 10 000 / s
            and 100 000.
        query_askers_max: clients tracked for that at most (those of the last ``query_burst / query_rate_per_s``
            seconds); new ones past it share one bucket, so made-up inboxes cannot grow memory. At most 100 000.
        log_format: ``auto`` (JSON unless stderr is a terminal), ``json`` or ``console``.
        store: the DuckDB history (``[store]``), see :class:`StoreConfig`.
        alerts: the webhook sink (``[alerts]``), see :class:`AlertsConfig`.
        canary: fault-injection canaries (``[canary]``), see :class:`CanaryConfig`.
        detectors: one table per detector (``[detectors.grad_spike]``), see ``trainvigil.daemon.detectors``.
    """

    data_dir: Annotated[str, Meta(pattern=r"\S", description="a directory path")] = "vigil-data"
    nats_url: str = ""
    shard: str = ""
    namespace: str = ""
    embedded_port: Annotated[int, Meta(ge=1, le=65535, description="a port number 1-65535")] = 4222
    embedded_host: _Host = "127.0.0.1"
    embedded_auth: Literal["auto", "on", "off"] = "auto"
    embedded_tls_cert: str = ""
    embedded_tls_key: str = ""
    nats_creds: str = ""
    nats_tls_ca: str = ""
    connect_timeout_s: _Wait = 15.0
    http_host: _Host = "127.0.0.1"
    http_port: Annotated[int, Meta(ge=0, le=65535, description="a port number 0-65535")] = 9464
    http_token_file: str = ""
    http_allowed_hosts: str | list[str] = ""
    fetch_batch: _Count = 1024
    fetch_max_bytes: _Size = 8 * 2**20
    fetch_timeout_s: _Wait = 0.25
    query_row_limit: _Count = QUERY_ROW_LIMIT
    query_timeout_s: _Wait = 30.0
    query_max_bytes: _Size = 16 * 2**20
    query_memory_bytes: _Size = 512 * 2**20
    query_spill_bytes: _Size = 256 * 2**20
    query_concurrency: _Count = 2
    query_rate_per_s: Annotated[float, Meta(gt=0, le=10_000, description="a number > 0 and <= 10000")] = 20.0
    query_burst: _Buckets = 40
    query_askers_max: _Buckets = 1024
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """The lowest level logged: ``debug``, ``info``, ``warning`` or ``error``."""
    stream: StreamConfig = StreamConfig()
    store: StoreConfig = StoreConfig()
    alerts: AlertsConfig = AlertsConfig()
    canary: CanaryConfig = msgspec.field(default_factory=CanaryConfig)
    detectors: DetectorsConfig = msgspec.field(default_factory=DetectorsConfig)

    def __post_init__(self) -> None:
        _check_limits(self)
        if self.nats_url:
            _nats_url(self.nats_url)
        if self.shard:
            try:
                parse_shard(self.shard)
            except ValueError:
                _require("shard", self.shard, f"INDEX/COUNT like 0/2, 0 <= INDEX < COUNT <= {MAX_SHARDS}", False)
            rule = "given with nats_url (--nats): the bundled broker does not partition runs over shards"
            _require("shard", self.shard, rule, bool(self.nats_url))
        Subjects(self.namespace)  # a bad namespace is refused here, naming the setting and the rule
        both = bool(self.embedded_tls_cert) == bool(self.embedded_tls_key)
        _require("embedded_tls_key", self.embedded_tls_key, "given together with embedded_tls_cert", both)

    @property
    def allowed_hosts(self) -> tuple[str, ...]:
        """``http_allowed_hosts`` as a list of names."""
        return _names(self.http_allowed_hosts)

    @property
    def db_path(self) -> Path:
        return Path(self.data_dir) / "vigil.duckdb"

    @property
    def subjects(self) -> Subjects:
        """The subjects of this daemon's namespace: what it subscribes to and publishes on."""
        return Subjects(self.namespace)

    @property
    def shard_id(self) -> ShardId | None:
        """This daemon's shard (of its namespace's deployment); ``None`` when it owns every run."""
        return parse_shard(self.shard, self.subjects) if self.shard else None

    @property
    def stream_subjects(self) -> list[str]:
        """What this daemon's stream captures: every run's subjects of its namespace, or its shard's partition."""
        shard = self.shard_id
        return shard.stream_subjects if shard is not None else self.subjects.stream_subjects

    def for_shard(self) -> DaemonConfig:
        """The configuration the daemon runs with: the stream of its namespace, and a shard's stream and
        consumer carry its index.

        A namespace N has a stream of its own, ``VIGIL_N``, unless ``stream.name`` names another. Each shard
        owns a stream of its own (so stream sequences stay contiguous per consumer, which the ingest's
        exactly-once bookkeeping rests on) and its own durable consumer and offsets. Default namespace and
        unsharded: ``self``, unchanged.
        """
        shard = self.shard_id
        name = self.subjects.stream_name if self.stream.name == STREAM else self.stream.name
        if shard is None and name == self.stream.name:
            return self
        consumer = self.stream.consumer
        if shard is not None:
            name, consumer = f"{name}-{shard.index}", f"{consumer}-{shard.index}"
        return msgspec.structs.replace(self, stream=msgspec.structs.replace(self.stream, name=name, consumer=consumer))


def load(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] = os.environ,
) -> DaemonConfig:
    """Build the configuration.

    Args:
        path: a TOML file (``--config``); its keys are the field names above, with
            ``[stream]`` as a table.
        overrides: values from command-line flags (dotted keys), ``None`` values ignored.

    Raises:
        ConfigError: the file is missing or not TOML, a key is unknown, or a value has the
            wrong type; the message names the key and where it came from.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            tree = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist", key="config") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}", key="config") from None
    from_env(DaemonConfig, env, tree)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            set_path(tree, tuple(dotted.split(".")), value)
    try:
        return convert(tree, DaemonConfig)
    except msgspec.ValidationError as exc:
        problem, key = _decode_error(exc, tree)
        raise ConfigError(
            f"invalid configuration: {problem} (from {path or 'defaults'}, VIGIL_* environment or flags)", key=key
        ) from None
