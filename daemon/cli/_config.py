"""The configuration a client command runs with, and the flags every command that talks to a daemon takes.

One place reads them (:func:`command_config`): the daemon's TOML file (``--config``), the ``VIGIL_*``
environment and the flags ``--data-dir``, ``--nats``, ``--creds`` and ``--namespace``, so ``vigil sql``,
``runs``, ``export``, ``alerts --follow``, ``report``, ``plot``, ``canary`` and ``bench-optim`` find the
daemon the same way, in the same namespace (``VIGIL_NAMESPACE`` or ``--namespace``).

Each of those flags is spelt here once (its name, ``dest`` and metavar); a command may word its help to say what
the flag means there (``vigil up``'s ``--data-dir`` is where it writes).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainvigil.schemas.subjects import Subjects

if TYPE_CHECKING:
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.schemas.credentials import BusAccess

NAMESPACE_HELP = (
    "the namespace of the daemon to talk to, on a broker that several deployments share (VIGIL_NAMESPACE; "
    "default: the default namespace)"
)
READ_DATA_DIR_HELP = "data directory to read when no daemon answers (default ./vigil-data)"
DAEMON_DATA_DIR_HELP = "the daemon's data directory (default ./vigil-data)"
NATS_HELP = "broker of the daemon (default VIGIL_NATS_URL or local)"
CONFIG_HELP = "the daemon's TOML configuration file (its nats_url, embedded_port, data_dir)"
READER_CREDS_HELP = "a reader's credentials file (VIGIL_NATS_CREDS; default DATA_DIR/bus/reader.toml if there)"


def add_data_dir(parser: argparse.ArgumentParser, what: str = READ_DATA_DIR_HELP) -> None:
    """``--data-dir DATA_DIR``."""
    parser.add_argument("--data-dir", help=what)


def add_nats(parser: argparse.ArgumentParser, what: str = NATS_HELP) -> None:
    """``--nats NATS_URL``."""
    parser.add_argument("--nats", dest="nats_url", help=what)


def add_config(parser: argparse.ArgumentParser, what: str = CONFIG_HELP) -> None:
    """``--config CONFIG``."""
    parser.add_argument("--config", help=what)


def add_creds(parser: argparse.ArgumentParser, what: str = READER_CREDS_HELP) -> None:
    """``--creds FILE``."""
    # A path, never the secret itself: a command line is visible to every user of the machine (ps).
    parser.add_argument("--creds", dest="nats_creds", metavar="FILE", help=what)


def add_namespace(parser: argparse.ArgumentParser, what: str = NAMESPACE_HELP) -> None:
    """``--namespace NAME``."""
    parser.add_argument("--namespace", metavar="NAME", help=what)


def add_daemon_flags(
    parser: argparse.ArgumentParser,
    *,
    data_dir: str = READ_DATA_DIR_HELP,
    creds: str = READER_CREDS_HELP,
    limit: bool = False,
) -> None:
    """Where the daemon is: ``--data-dir``, ``--nats``, ``--config``, ``--creds`` and ``--namespace``, the flags
    :func:`command_config` reads.

    Args:
        data_dir, creds: their help, as this command uses them.
        limit: also ``--limit N``, a reading command's row limit (listed before ``--creds``).
    """
    add_data_dir(parser, data_dir)
    add_nats(parser)
    add_config(parser)
    if limit:
        parser.add_argument("--limit", type=int, default=None, help="row limit (default: the daemon's, 10000)")
    add_creds(parser, creds)
    add_namespace(parser)


def namespace_subjects(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> Subjects:
    """The subjects of ``--namespace``, else of ``VIGIL_NAMESPACE``: for the commands that read no daemon
    configuration (``vigil push``, ``auth``, ``shards``).

    Raises:
        ConfigError: not a valid namespace.
    """
    return Subjects(args.namespace if args.namespace is not None else env.get("VIGIL_NAMESPACE", ""))


def command_config(args: argparse.Namespace) -> DaemonConfig:
    """The configuration of a command with the daemon's flags (:func:`add_daemon_flags`).

    Raises:
        ConfigError: the file, a variable or a flag is not valid (a bad ``--namespace`` included).
    """
    from trainvigil.daemon import config as config_mod

    overrides = {
        "data_dir": args.data_dir,
        "nats_url": args.nats_url,
        "nats_creds": args.nats_creds,
        "namespace": args.namespace,
    }
    return config_mod.load(args.config, overrides)


def reader(args: argparse.Namespace) -> tuple[DaemonConfig, str, BusAccess]:
    """The configuration a reading command runs with (its namespace's subjects: ``cfg.subjects``), the daemon's
    broker URL and a reader's access to it.

    Raises:
        ConfigError: as :func:`command_config`.
    """
    from trainvigil.daemon.broker.bus import access

    cfg = command_config(args)
    return cfg, cfg.nats_url or f"nats://127.0.0.1:{cfg.embedded_port}", access(cfg, "reader")
