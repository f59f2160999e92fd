"""``vigil shards``: what a NATS node's configuration needs for N daemon shards, and which shard holds a run.

``vigil shards mappings N`` prints the ``mappings`` block every node of the cluster needs (top level
without accounts; inside the account's block with them, e.g. ``accounts.VIGIL`` of ``vigil auth``).
``vigil shards which RUN N`` prints the shard the broker routes RUN to (the server's own hash).
"""

from __future__ import annotations

import argparse
import json

from trainvigil.daemon.cli._config import add_namespace, namespace_subjects
from trainvigil.daemon.cli._exits import EXIT_OK
from trainvigil.schemas.shards import MAX_SHARDS, partition_mappings, shard_of
from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, Subjects


def shard_count(text: str) -> int:
    """An argparse type: a shard count from 1 to MAX_SHARDS."""
    value = int(text)
    if not 1 <= value <= MAX_SHARDS:
        raise argparse.ArgumentTypeError(f"a shard count from 1 to {MAX_SHARDS}, not {value}")
    return value


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    shards = sub.add_parser(
        "shards",
        help="the NATS subject mappings that partition runs over N daemon shards; which shard holds a run",
        description="Daemon shards (vigil up --shard I/N) own the runs the broker maps to their partition. "
        "Every NATS node needs the same mappings block; change N only as the docs' cluster page describes.",
    )
    action = shards.add_subparsers(dest="action", required=True, metavar="ACTION")
    mappings = action.add_parser("mappings", help="print the mappings block for N shards (nats-server config)")
    mappings.add_argument("count", type=shard_count, metavar="N", help="the number of daemon shards")
    add_namespace(mappings, "the mappings of this namespace's subjects (VIGIL_NAMESPACE; default: the default one)")
    which = action.add_parser("which", help="print the shard (I/N) the broker routes a run's records to")
    which.add_argument("run_id", help="the run id")
    which.add_argument("count", type=shard_count, metavar="N", help="the number of daemon shards")
    shards.set_defaults(command_run=run)


def mappings_block(count: int, subjects: Subjects = DEFAULT_SUBJECTS) -> str:
    """The nats-server configuration text: ``mappings { "source": "destination", ... }`` (of ``subjects``'
    namespace)."""
    lines = [f"  {json.dumps(src)}: {json.dumps(dst)}" for src, dst in partition_mappings(count, subjects).items()]
    return "mappings {\n" + "\n".join(lines) + "\n}\n"


def run(args: argparse.Namespace) -> int:
    if args.action == "mappings":
        print(mappings_block(args.count, namespace_subjects(args)), end="")
    else:
        print(f"{shard_of(args.run_id, args.count)}/{args.count}")
    return EXIT_OK
