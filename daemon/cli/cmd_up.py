"""``vigil up``: run the daemon until SIGTERM/SIGINT, and say what a failed start means."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainvigil.daemon.cli._config import add_config, add_creds, add_data_dir, add_namespace, add_nats
from trainvigil.daemon.cli._exits import EXIT_OK
from trainvigil.daemon.cli._failures import leaves, lock_holder
from trainvigil.errors import ConfigError
from trainvigil.schemas.redact import redact_url

if TYPE_CHECKING:
    from trainvigil.daemon.config import DaemonConfig


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser(
        "up",
        help="run the daemon (sidecar): embedded nats-server unless --nats, data in --data-dir",
        description="Run the daemon until SIGTERM/SIGINT. Without --nats it uses 127.0.0.1:4222 if a broker "
        "answers there, else starts the bundled nats-server with JetStream storage under DATA_DIR. It serves the "
        "web view (runs, their curves, alerts) at http://127.0.0.1:9464/, Prometheus metrics at /metrics and a "
        "health check at /healthz on the same port: --http-host and --http-port move them, --http-port 0 turns "
        "them off.",
    )
    add_data_dir(up, "where vigil.duckdb lives (default ./vigil-data, VIGIL_DATA_DIR)")
    add_nats(up, "broker URL, or a cluster's node URLs comma-separated (VIGIL_NATS_URL); default: embedded")
    up.add_argument(
        "--shard",
        metavar="I/N",
        help="own the runs the broker partitions to shard I of N, with its own stream, consumer and data "
        "directory (VIGIL_SHARD; needs --nats; see `vigil shards`)",
    )
    up.add_argument(
        "--embedded-port",
        type=int,
        help="port of the bundled nats-server, and where a running broker is looked for first "
        "(default 4222, VIGIL_EMBEDDED_PORT)",
    )
    add_config(up, "TOML configuration file")
    add_namespace(
        up,
        "serve only this namespace's agents and commands, on a broker that several deployments share "
        "(VIGIL_NAMESPACE; default: the default namespace)",
    )
    up.add_argument(
        "--http-host", help="address of the web view (/), /metrics and /healthz (default 127.0.0.1, VIGIL_HTTP_HOST)"
    )
    up.add_argument(
        "--http-port",
        type=int,
        help="port of the web view (/), /metrics and /healthz (default 9464, 0 = off, VIGIL_HTTP_PORT)",
    )
    up.add_argument("--drain", action="store_true", help="exit once every message in the stream is stored")
    up.add_argument(
        "--embedded-host",
        help="address the bundled nats-server listens on (default 127.0.0.1, VIGIL_EMBEDDED_HOST); off loopback "
        "it requires credentials",
    )
    up.add_argument(
        "--auth",
        dest="embedded_auth",
        action="store_const",
        const="on",
        help="users and permissions on the bundled nats-server even on loopback (VIGIL_EMBEDDED_AUTH=on); "
        "credentials are written once under DATA_DIR/bus",
    )
    add_creds(up, "the daemon's credentials file (VIGIL_NATS_CREDS); default DATA_DIR/bus/daemon.toml")
    up.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    import anyio

    from trainvigil.daemon import config as config_mod
    from trainvigil.daemon.app import serve
    from trainvigil.daemon.broker.bus import agents_hint
    from trainvigil.daemon.logs import configure
    from trainvigil.daemon.malloc import tune, tune_gc

    tune()  # before any thread starts: big buffers back to the system when freed (see daemon/malloc.py)
    tune_gc()  # cycles are collected rarely (see daemon/malloc.py)
    cfg = config_mod.load(
        args.config,
        {
            "data_dir": args.data_dir,
            "nats_url": args.nats_url,
            "shard": args.shard,
            "namespace": args.namespace,
            "embedded_port": args.embedded_port,
            "http_host": args.http_host,
            "http_port": args.http_port,
            "embedded_host": args.embedded_host,
            "embedded_auth": args.embedded_auth,
            "nats_creds": args.nats_creds,
        },
    )
    configure(cfg.log_format, cfg.log_level)
    check_data_dir(cfg.data_dir)

    started: list[str] = []

    def ready(url: str) -> None:
        started.append(url)
        print(
            f"vigil: daemon ready; point agents at VIGIL_NATS_URL={redact_url(url)}"
            + (f" VIGIL_NAMESPACE={cfg.namespace}" if cfg.namespace else "")
            + f"{agents_hint(cfg)} "
            f"(data in {cfg.data_dir})",
            file=sys.stderr,
            flush=True,
        )
        if cfg.http_port:
            print(f"vigil: open http://{_url_host(cfg.http_host)}:{cfg.http_port}/", file=sys.stderr, flush=True)

    try:
        anyio.run(lambda: serve(cfg, drain=args.drain, on_ready=ready), backend="asyncio")
    except Exception as exc:
        # What fails once the daemon runs is not a start-up problem (a database error then is no "cannot open").
        explained = None if started else startup_error(exc, cfg)
        if explained is None:
            raise
        raise explained from exc
    return EXIT_OK


def _url_host(host: str) -> str:
    """The host part of a URL for the address the HTTP side binds (all addresses: this machine's loopback)."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def check_data_dir(path: str) -> None:
    """Create the data directory, or say why it cannot be one (before anything starts).

    Raises:
        ConfigError: ``path`` is a file, cannot be created or is not writable.
    """
    where = Path(path)
    if where.exists() and not where.is_dir():
        raise ConfigError(
            f"data_dir {path} is a file, not a directory; pass --data-dir with a directory", key="data_dir"
        )
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"data_dir {path} cannot be created ({exc.strerror or exc}); pass --data-dir with a directory you can "
            "write to",
            key="data_dir",
        ) from None
    if not os.access(where, os.W_OK | os.X_OK):
        raise ConfigError(f"data_dir {path} is not writable; pass --data-dir with one you can write to", key="data_dir")


def startup_error(exc: BaseException, cfg: DaemonConfig) -> Exception | None:
    """What a failed ``vigil up`` means, as the error that says what to do (``None``: not known here)."""
    import duckdb

    for leaf in leaves(exc):
        if isinstance(leaf, duckdb.Error) and (holder := lock_holder(leaf)):
            return ConfigError(
                f"data_dir {cfg.data_dir} is in use by {holder} (another `vigil up`?); stop it, or give this "
                "daemon its own --data-dir",
                key="data_dir",
            )
        if isinstance(leaf, duckdb.Error):
            return ConfigError(f"data_dir: cannot open {cfg.db_path}: {leaf}", key="data_dir")
        # The HTTP listener is the only socket the daemon binds.
        if isinstance(leaf, OSError) and leaf.errno == errno.EADDRINUSE:
            return ConfigError(
                f"http_port: {cfg.http_host}:{cfg.http_port} is in use by another program; pass --http-port with a "
                "free port (0 turns HTTP off)",
                key="http_port",
            )
        if isinstance(leaf, OSError) and leaf.errno == errno.EADDRNOTAVAIL:
            return ConfigError(f"http_host {cfg.http_host} is not an address of this machine", key="http_host")
    return None
