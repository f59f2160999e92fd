"""The bus's users and what each may do: the nats-server configuration that enforces it, and its files.

Three roles, one NATS account (``VIGIL``, with JetStream):

- ``agent`` publishes its records (``vigil.v1.<run>.<kind>``, what the stream captures) and reads
  the JetStream acknowledgements in its own inbox. Nothing else: no alerts, no queries, no
  JetStream API, no other role's inbox.
- ``reader`` sends queries (``vigil.v1.ctl.sql``), reads their answers in its own inbox and reads
  alerts (``vigil.v1.alerts.>``): ``vigil sql``, ``runs``, ``export``, ``alerts --follow``.
- ``daemon`` may do anything in the account. It owns the stream and its consumer (the JetStream
  API), answers queries in readers' inboxes and publishes alerts; a list narrower than
  "everything" would only break the next feature, and whoever holds the daemon's password holds
  its database anyway.

Deny beats allow in nats-server, so an agent's ``vigil.v1.*.run`` can never reach a control or
alert subject even though ``*`` would match ``ctl`` or ``alerts``.

In a namespace N (``vigil up --auth --namespace N``, ``vigil auth DIR --namespace N``) every subject above
is N's (``N.vigil.v1.<run>.<kind>``...): its agents and readers reach nothing of another namespace.

Every agent of the one ``agent`` user may publish any run's records and read every agent's acks (the
server grants per user). Teams that must not share that get agents limited to their own runs:
``vigil auth DIR --team NAME=RUN[,RUN...]`` writes a user ``agent-NAME`` (``DIR/agent-NAME.toml``) that may
publish records of those runs only (``vigil.v1.<run>.<kind>``, and ``vigil.v1.*.<run>.<kind>``, the
partitioned subjects, when runs are sharded) and read ``_INBOX.agent-NAME.>`` only. The runs are named
one by one: nats-server's wildcards match whole subject tokens, and a run is one token, so no permission
can say "runs starting with vision-" (``vigil.v1.vision-*.metrics`` would be a literal subject). The
teams are kept in ``DIR/teams.json``; naming a team again replaces its runs (a running nats-server
takes the new file on a reload, ``nats-server --signal reload``). The ``agent`` user stays as it is.

Files (a directory of mode 0700, every file 0600): one credentials file per role (see
:mod:`trainvigil.schemas.credentials`), created once and kept, and ``nats-server.conf``, written
again from them at every start (so a TLS setting that changed takes effect). Passwords sit in
plain text in that config: nats-server's alternative, bcrypt, needs a package the daemon does not
have, and the same secrets are in the credentials files beside it, just as private.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainvigil.daemon.broker.teams import TEAMS_FILE, Team, read_teams, teams_text
from trainvigil.errors import ConfigError
from trainvigil.schemas.credentials import Credentials, credentials_text, inbox_prefix, read_credentials
from trainvigil.schemas.shards import partition_mappings, partition_subjects
from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, KINDS, Subjects, run_token

ACCOUNT = "VIGIL"
ROLES = ("agent", "daemon", "reader")
SERVER_CONFIG = "nats-server.conf"
_NOTES = {
    "agent": "Training processes: VIGIL_NATS_CREDS=<this file>. Publishes records only.",
    "daemon": "vigil up: VIGIL_NATS_CREDS=<this file>. Owns the stream; never give it to anyone else.",
    "reader": "vigil sql / runs / export / alerts: VIGIL_NATS_CREDS=<this file>. Queries and alerts only.",
}


def credentials_file(directory: Path, role: str) -> Path:
    """Where ``role``'s credentials live in ``directory``."""
    return directory / f"{role}.toml"


def permissions(
    role: str,
    user: str,
    *,
    sharded: bool = False,
    runs: Sequence[str] | None = None,
    subjects: Subjects = DEFAULT_SUBJECTS,
) -> dict[str, Any] | None:
    """The nats-server permissions of ``role`` (``None``: everything, the daemon's) on ``subjects``' namespace.

    ``sharded``: the account maps runs to shards. nats-server checks a publish against the subject
    after mapping too, so an agent then also needs the partitioned subjects (``vigil.v1.<P>.<run>.<kind>``).
    ``runs``: an agent limited to these runs (a team's, see the module's docstring); ``None``: every run.
    """
    inbox = f"{inbox_prefix(user)}.>"
    prefix = subjects.prefix
    if role == "agent":
        if runs is None:
            allow = [*subjects.stream_subjects, *(partition_subjects(subjects=subjects) if sharded else ())]
        else:
            tokens = list(dict.fromkeys(run_token(run) for run in runs))
            allow = [f"{prefix}.{token}.{kind}" for token in tokens for kind in KINDS]
            allow += [f"{prefix}.*.{token}.{kind}" for token in tokens for kind in KINDS] if sharded else []
        publish = {"allow": allow, "deny": [subjects.alerts, subjects.control]}
        return {"publish": publish, "subscribe": {"allow": [inbox]}}
    if role == "reader":
        # The query subject, and under it the shards' roll call and their own query subjects.
        publish = {"allow": [subjects.query, f"{subjects.query}.>"]}
        return {"publish": publish, "subscribe": {"allow": [subjects.alerts, inbox]}}
    if role == "daemon":
        return None
    raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")


def server_config(
    users: Mapping[str, Credentials],
    tls: tuple[Path, Path] | None = None,
    shards: int | None = None,
    teams: Sequence[tuple[Team, Credentials]] = (),
    subjects: Subjects = DEFAULT_SUBJECTS,
) -> str:
    """The nats-server configuration of these users (role → credentials), and TLS with (cert, key) when given.

    ``teams``: agents limited to their runs, each team with its user's credentials. ``subjects``: the
    namespace the agents and readers are granted (the daemon's user may do anything in the account).

    ``shards``: the subject mappings that partition runs over that many daemon shards
    (``vigil up --shard I/N``), in the account with the users (mappings are per account), else at the top.

    No users: no accounts either (anyone may connect, as without a configuration). Listen address,
    port and JetStream's store stay on the command line, so the embedded broker and a container
    (compose.yaml) run the same file. nats-server reads JSON as its own format.
    """
    sharded = shards is not None
    granted = [
        (creds, permissions(role, creds.user, sharded=sharded, subjects=subjects)) for role, creds in users.items()
    ]
    granted += [
        (creds, permissions("agent", creds.user, sharded=sharded, runs=team.runs, subjects=subjects))
        for team, creds in teams
    ]
    entries = []
    for creds, allowed in granted:
        entry: dict[str, Any] = {"user": creds.user, "password": creds.password}
        if allowed is not None:
            entry["permissions"] = allowed
        entries.append(entry)
    config: dict[str, Any] = {"accounts": {ACCOUNT: {"jetstream": "enabled", "users": entries}}} if entries else {}
    if shards is not None:
        (config["accounts"][ACCOUNT] if entries else config)["mappings"] = partition_mappings(shards, subjects)
    if tls is not None:
        config["tls"] = {"cert_file": str(tls[0]), "key_file": str(tls[1]), "timeout": 5}
    header = "# Written by trainvigil (daemon/broker/auth.py) from the credentials files beside it; edits are lost.\n"
    return header + json.dumps(config, indent=2) + "\n"


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically; the file is mode 0600 from its first byte."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _private_dir(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create {directory} for the bus's credentials: {exc.strerror or exc}") from None


def ensure_users(directory: Path) -> dict[str, Credentials]:
    """Every role's credentials in ``directory``: read when there, else created once with a random password.

    Raises:
        ConfigError: the directory cannot be created, or a credentials file there is unreadable.
    """
    _private_dir(directory)
    users = {}
    for role in ROLES:
        path = credentials_file(directory, role)
        if not path.exists():
            creds = Credentials(user=role, password=secrets.token_urlsafe(32))
            write_private(path, credentials_text(creds, role, _NOTES[role]))
        users[role] = read_credentials(path, key=f"the {role} credentials")
    return users


def ensure_teams(directory: Path, teams: Sequence[Team] = ()) -> list[tuple[Team, Credentials]]:
    """The teams kept in ``directory`` with ``teams`` added (a team given again: its new runs), kept there,
    each with its user's credentials (created once with a random password, like :func:`ensure_users`).

    Raises:
        ConfigError: the teams file or a team's credentials file there is unreadable.
    """
    kept = read_teams(directory)
    if teams:
        kept |= {team.name: team for team in teams}
        write_private(directory / TEAMS_FILE, teams_text(kept.values()))
    granted = []
    for team in kept.values():
        path = credentials_file(directory, team.user)
        if not path.exists():
            note = f"Training processes of team {team.name}: VIGIL_NATS_CREDS=<this file>. Publishes its runs only."
            write_private(
                path, credentials_text(Credentials(user=team.user, password=secrets.token_urlsafe(32)), "agent", note)
            )
        granted.append((team, read_credentials(path, key=f"the credentials of team {team.name}")))
    return granted


def prepare(
    directory: Path,
    tls: tuple[Path, Path] | None = None,
    *,
    users: bool = True,
    shards: int | None = None,
    teams: Sequence[Team] = (),
    subjects: Subjects = DEFAULT_SUBJECTS,
) -> Path:
    """The users of :func:`ensure_users` and the teams of :func:`ensure_teams` (unless not ``users``) and the
    server configuration enforcing them on ``subjects``' namespace (and TLS with (cert, key) when given, and
    the mappings for ``shards`` daemon shards); returns its path.

    Raises:
        ConfigError: ``directory`` or a file in it cannot be written, or a credentials or teams file there
            is unreadable.
    """
    path = directory / SERVER_CONFIG
    try:
        _private_dir(directory)
        roles, granted = (ensure_users(directory), ensure_teams(directory, teams)) if users else ({}, [])
        write_private(path, server_config(roles, tls, shards, granted, subjects))
    except OSError as exc:
        raise ConfigError(f"cannot write the bus's users in {directory}: {exc.strerror or exc}") from None
    return path
