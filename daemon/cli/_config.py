"""The configuration a client command runs with, and the flags every command that talks to a daemon takes.

One place reads them (:func:`command_config`): the daemon's TOML file (``--config``), the ``VIGIL_*``
environment and the flags ``--data-dir``, ``--nats``, ``--creds`` and ``--namespace``, so ``vigil sql``,
``runs``, ``export``, ``alerts --follow``, ``report``, ``plot``, ``canary`` and ``bench-optim`` find the
daemon the same way, in the same namespace (``VIGIL_NAMESPACE`` or ``--namespace``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainvigil.schemas.subjects import Subjects

if TYPE_CHECKING:
    from trainvigil.daemon.config import DaemonConfig

NAMESPACE_HELP = (
    "the namespace of the daemon to talk to, on a broker that several deployments share (VIGIL_NAMESPACE; "
    "default: the default namespace)"
)


def add_namespace(parser: argparse.ArgumentParser, what: str = NAMESPACE_HELP) -> None:
    """``--namespace NAME``."""
    parser.add_argument("--namespace", metavar="NAME", help=what)


def namespace_subjects(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> Subjects:
    """The subjects of ``--namespace``, else of ``VIGIL_NAMESPACE``: for the commands that read no daemon
    configuration (``vigil push``, ``auth``, ``shards``).

    Raises:
        ConfigError: not a valid namespace.
    """
    return Subjects(args.namespace if args.namespace is not None else env.get("VIGIL_NAMESPACE", ""))


def command_config(args: argparse.Namespace) -> DaemonConfig:
    """The configuration of a command with the daemon's flags (:func:`add_namespace` and the others).

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
