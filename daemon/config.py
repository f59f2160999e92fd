"""Daemon configuration: defaults < TOML file < ``VIGIL_*`` environment < command-line flags.

Every key has an environment name: ``VIGIL_`` + the dotted key upper-cased with ``.``
turned into ``_`` (``stream.max_age_s`` → ``VIGIL_STREAM_MAX_AGE_S``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from trainvigil.errors import ConfigError

from .detectors import DetectorsConfig


class StreamConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The JetStream stream and the daemon's durable consumer."""

    name: str = "VIGIL"
    max_age_s: float = 7 * 86400.0
    max_bytes: int = 10 * 2**30
    duplicate_window_s: float = 120.0
    consumer: str = "vigil-daemon"


class AlertsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where alerts go besides NATS, DuckDB and the log.

    Attributes:
        webhook_url: ``http(s)://`` URL that gets a JSON POST per alert update (Slack-compatible
            body); empty: no webhook.
        timeout_s: one POST (connect, send, status line) gives up after this long.
        retries: further attempts after a failed one (connection error, timeout, 5xx, 408, 429).
        backoff_s: wait before the first retry; doubled for each later one.
        queue_size: updates waiting for the webhook; past it the oldest is dropped and counted.
        drain_s: on shutdown, queued updates get this long to go out.
    """

    webhook_url: str = ""
    timeout_s: float = 5.0
    retries: int = 3
    backoff_s: float = 1.0
    queue_size: int = 1000
    drain_s: float = 5.0

    def __post_init__(self) -> None:
        if self.webhook_url and not self.webhook_url.startswith(("http://", "https://")):
            raise ValueError(f"alerts.webhook_url must start with http:// or https://, not {self.webhook_url!r}")
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0 or self.queue_size < 1 or self.drain_s < 0:
            raise ValueError("alerts: timeout_s and queue_size must be positive; retries, backoff_s, drain_s >= 0")


class DaemonConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything ``vigil up`` is configured with.

    Attributes:
        data_dir: where ``vigil.duckdb`` (and the embedded broker's JetStream store) live.
        nats_url: the broker; empty means: use 127.0.0.1:4222 if something answers there,
            else start the bundled ``nats-server`` on that port.
        http_host, http_port: where ``/healthz`` and ``/metrics`` are served (port 0: off).
        fetch_batch: messages fetched (and committed in one transaction) at a time.
        query_row_limit: rows a ``vigil sql`` answer holds at most.
        query_timeout_s: a query running longer is interrupted.
        log_format: ``auto`` (JSON unless stderr is a terminal), ``json`` or ``console``.
        alerts: the webhook sink (``[alerts]``), see :class:`AlertsConfig`.
        detectors: one table per detector (``[detectors.grad_spike]``), see ``trainvigil.daemon.detectors``.
    """

    data_dir: str = "vigil-data"
    nats_url: str = ""
    embedded_port: int = 4222
    http_host: str = "127.0.0.1"
    http_port: int = 9464
    fetch_batch: int = 256
    fetch_timeout_s: float = 0.25
    query_row_limit: int = 10_000
    query_timeout_s: float = 30.0
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    stream: StreamConfig = StreamConfig()
    alerts: AlertsConfig = AlertsConfig()
    detectors: DetectorsConfig = msgspec.field(default_factory=DetectorsConfig)  # type: ignore[valid-type]

    @property
    def db_path(self) -> Path:
        return Path(self.data_dir) / "vigil.duckdb"


def _env_names(struct: type[msgspec.Struct], path: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """``VIGIL_*`` name → the path of the key it sets."""
    names: dict[str, tuple[str, ...]] = {}
    for field in msgspec.structs.fields(struct):
        key = (*path, field.name)
        if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            names.update(_env_names(field.type, key))
        else:
            names["VIGIL_" + "_".join(key).upper()] = key
    return names


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


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
    for env_name, key_path in _env_names(DaemonConfig).items():
        if env.get(env_name, "") != "":
            _set(tree, key_path, env[env_name])
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set(tree, tuple(dotted.split(".")), value)
    try:
        # strict=False lets environment strings convert to numbers ("9464" -> 9464).
        return msgspec.convert(tree, DaemonConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(
            f"invalid configuration: {exc} (from {path or 'defaults'}, VIGIL_* environment or flags)"
        ) from None
