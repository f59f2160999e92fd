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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainvigil.errors import ConfigError
from trainvigil.schemas import PREFIX, QUERY_SUBJECT, STREAM_SUBJECTS
from trainvigil.schemas.credentials import Credentials, credentials_text, inbox_prefix, read_credentials
from trainvigil.schemas.shards import partition_mappings, partition_subjects

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


def permissions(role: str, user: str, *, sharded: bool = False) -> dict[str, Any] | None:
    """The nats-server permissions of ``role`` (``None``: everything, the daemon's).

    ``sharded``: the account maps runs to shards. nats-server checks a publish against the subject
    after mapping too, so an agent then also needs the partitioned subjects (``vigil.v1.<P>.<run>.<kind>``).
    """
    inbox = f"{inbox_prefix(user)}.>"
    if role == "agent":
        allow = [*STREAM_SUBJECTS, *(partition_subjects() if sharded else ())]
        publish = {"allow": allow, "deny": [f"{PREFIX}.alerts.>", f"{PREFIX}.ctl.>"]}
        return {"publish": publish, "subscribe": {"allow": [inbox]}}
    if role == "reader":
        # The query subject, and under it the shards' roll call and their own query subjects.
        publish = {"allow": [QUERY_SUBJECT, f"{QUERY_SUBJECT}.>"]}
        return {"publish": publish, "subscribe": {"allow": [f"{PREFIX}.alerts.>", inbox]}}
    if role == "daemon":
        return None
    raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")


def server_config(
    users: Mapping[str, Credentials], tls: tuple[Path, Path] | None = None, shards: int | None = None
) -> str:
    """The nats-server configuration of these users (role → credentials), and TLS with (cert, key) when given.

    ``shards``: the subject mappings that partition runs over that many daemon shards
    (``vigil up --shard I/N``), in the account with the users (mappings are per account), else at the top.

    No users: no accounts either (anyone may connect, as without a configuration). Listen address,
    port and JetStream's store stay on the command line, so the embedded broker and a container
    (compose.yaml) run the same file. nats-server reads JSON as its own format.
    """
    entries = []
    for role, creds in users.items():
        entry: dict[str, Any] = {"user": creds.user, "password": creds.password}
        if (granted := permissions(role, creds.user, sharded=shards is not None)) is not None:
            entry["permissions"] = granted
        entries.append(entry)
    config: dict[str, Any] = {"accounts": {ACCOUNT: {"jetstream": "enabled", "users": entries}}} if entries else {}
    if shards is not None:
        (config["accounts"][ACCOUNT] if entries else config)["mappings"] = partition_mappings(shards)
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


def prepare(
    directory: Path, tls: tuple[Path, Path] | None = None, *, users: bool = True, shards: int | None = None
) -> Path:
    """The users of :func:`ensure_users` (unless not ``users``) and the server configuration enforcing them
    (and TLS with (cert, key) when given, and the mappings for ``shards`` daemon shards); returns its path.

    Raises:
        ConfigError: ``directory`` or a file in it cannot be written, or a credentials file there is unreadable.
    """
    path = directory / SERVER_CONFIG
    try:
        _private_dir(directory)
        write_private(path, server_config(ensure_users(directory) if users else {}, tls, shards))
    except OSError as exc:
        raise ConfigError(f"cannot write the bus's users in {directory}: {exc.strerror or exc}") from None
    return path
