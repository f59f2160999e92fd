"""``vigil auth``: the bus's users (agent, daemon, reader, teams' agents) and a nats-server config enforcing them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainvigil.daemon.cli._config import add_namespace, namespace_subjects
from trainvigil.daemon.cli._exits import EXIT_OK
from trainvigil.daemon.cli.cmd_shards import shard_count

if TYPE_CHECKING:
    from trainvigil.daemon.broker.teams import Team


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    auth = sub.add_parser(
        "auth",
        help="create the bus's users (agent, daemon, reader) and a nats-server config enforcing them",
        description="Write DIR/agent.toml, DIR/daemon.toml and DIR/reader.toml (random passwords, mode 0600; "
        "kept if there) and DIR/nats-server.conf, the account and permissions to run a nats-server with "
        "(nats-server -c DIR/nats-server.conf -js). Point each process at its file with VIGIL_NATS_CREDS. "
        "vigil up --auth does the same for its bundled broker under DATA_DIR/bus. The agent user may publish "
        "every run; with --team NAME=RUN,... a team's agents get a user of their own (DIR/agent-NAME.toml) "
        "limited to its own runs.",
    )
    auth.add_argument("dir", help="directory for the files (created mode 0700)")
    auth.add_argument(
        "--team",
        action="append",
        type=_team,
        default=[],
        metavar="NAME=RUN[,RUN...]",
        help="also write DIR/agent-NAME.toml, agents limited to their own runs: they may publish records of "
        "these run ids only (and read their own acks only); repeat for each team. Kept in DIR/teams.json for "
        "every later start; naming a team again replaces its runs. Run ids one by one: NATS permissions "
        "match whole subject tokens, so no run-id prefix can be granted",
    )
    auth.add_argument(
        "--shards",
        type=shard_count,
        metavar="N",
        help="also partition runs over N daemon shards (the account's subject mappings; see `vigil shards`)",
    )
    add_namespace(
        auth, "grant agents and readers this namespace's subjects (VIGIL_NAMESPACE; default: the default one)"
    )
    auth.set_defaults(command_run=run)


def _team(text: str) -> Team:
    """An argparse type: ``--team NAME=RUN[,RUN...]``."""
    from trainvigil.daemon.broker.teams import parse_team

    try:
        return parse_team(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from trainvigil.daemon.broker.auth import ROLES, credentials_file, prepare
    from trainvigil.daemon.broker.teams import read_teams

    where = Path(args.dir)
    config = prepare(where, shards=args.shards, teams=args.team, subjects=namespace_subjects(args))
    users = [*ROLES, *(team.user for team in read_teams(where).values())]
    files = ", ".join(f"{user}: {credentials_file(where, user)}" for user in users)
    print(f"vigil: bus users in {where} ({files}); server config: {config}", file=sys.stderr)
    return EXIT_OK
