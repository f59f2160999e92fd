"""Who a client is on the bus: its credentials file, the CA it trusts, and what a refusal means.

The daemon writes one credentials file per role (``vigil up --auth``, ``vigil auth DIR``); every
client (an agent, the daemon, ``vigil sql``) reads the one that ``VIGIL_NATS_CREDS`` names. Both
sides import this module, so, like :mod:`.settings`, it sits in ``schemas`` without being a wire type.

Why user/password files and not NKeys or NATS ``.creds`` (JWT) files: nats-py needs the ``nkeys``
package (PyNaCl, compiled) for either, and a training image installs the agent alone; a password of
256 random bits in a 0600 file is as hard to guess, and nats-server checks it with nothing more.
The file is TOML, so a person can read which user it is::

    # trainvigil bus credentials: role agent. ...
    user = "agent"
    password = "..."

Replies to a user go to ``_INBOX.<user>.>`` (:func:`inbox_prefix`), so the server's permissions can
let each user read its own replies and nobody else's (an agent never sees a reader's SQL answers). Each
connection then keeps its inboxes under one random token of its own, ``_INBOX.<user>.<token>.…``
(:meth:`BusAccess.connect_options`): every inbox nats-py makes for it (``new_inbox()``, ``request()``'s, the
agent's acks) is there, and nothing of another connection is. Connections of one user can still read each
other's (the server grants per user): ``vigil auth DIR --team`` gives a team's agents a user of their own.
"""

from __future__ import annotations

import re
import secrets
import ssl
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from trainvigil.errors import ConfigError

CREDS_KEY = "nats_creds (VIGIL_NATS_CREDS, --creds)"
TLS_CA_KEY = "nats_tls_ca (VIGIL_NATS_TLS_CA)"
_USER = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A user name is one subject token, so that it can name its inbox."""


class Credentials(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One user of the bus (see the module's docstring for the file it comes from)."""

    user: str
    password: str

    def __post_init__(self) -> None:
        if not _USER.fullmatch(self.user):
            raise ValueError(f"user {self.user!r} must be 1-64 of A-Z a-z 0-9 _ -")
        if not self.password:
            raise ValueError("password must not be empty")


INBOX_ROOT = "_INBOX"
"""Where every inbox lives: nats-py's default prefix, and the root of each user's."""
CONNECTION_TOKEN_BYTES = 6
"""Random bytes of the token that keeps one connection's inboxes apart (12 hex characters, 48 bits)."""


def inbox_prefix(user: str) -> str:
    """Where replies to ``user`` go (``_INBOX.<user>``): a prefix the server can grant to that user alone."""
    return f"{INBOX_ROOT}.{user}"


def connection_inbox_prefix(user: str) -> str:
    """A fresh prefix for one connection of ``user``: ``_INBOX.<user>.<random token>``."""
    return f"{inbox_prefix(user)}.{secrets.token_hex(CONNECTION_TOKEN_BYTES)}"


def credentials_text(creds: Credentials, role: str, note: str) -> str:
    """The file :func:`read_credentials` reads: ``role`` and ``note`` as comments, then the user and password."""
    # TOML basic strings take JSON's escapes; users and generated passwords need none.
    return (
        f"# trainvigil bus credentials: role {role}. Secret: keep this file mode 0600.\n# {note}\n"
        f'user = "{creds.user}"\npassword = "{creds.password}"\n'
    )


def read_credentials(path: str | Path, key: str = CREDS_KEY) -> Credentials:
    """The credentials in the file at ``path``.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or lacks a valid ``user`` and ``password``;
            the message names ``key`` (the setting that pointed at the file), never the password.
    """
    try:
        tree = tomllib.loads(Path(path).read_text())
        return msgspec.convert(tree, Credentials)
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or exc})"
    except tomllib.TOMLDecodeError as exc:
        problem = f"is not TOML ({exc})"
    except msgspec.ValidationError as exc:
        problem = f"is not a credentials file ({exc})"
    raise ConfigError(
        f"{key}: {path} {problem}; point it at a file that `vigil up --auth` or `vigil auth DIR` wrote",
        key="nats_creds",
    )


def tls_context(ca_file: str | Path, key: str = TLS_CA_KEY) -> ssl.SSLContext:
    """A client TLS context that trusts the CA certificates in ``ca_file`` (PEM) and checks the host name.

    Raises:
        ConfigError: the file cannot be read or holds no certificate.
    """
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{key}: {ca_file} is not a readable PEM file of CA certificates ({exc})", key="nats_tls_ca"
        ) from None


class BusAccess(msgspec.Struct, frozen=True):
    """How one client proves who it is and whom it trusts: a credentials file and a CA file ("" = none)."""

    creds: str = ""
    tls_ca: str = ""

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``: user, password and inbox prefix; the TLS context.

        The inbox prefix is new at each call (:func:`connection_inbox_prefix`): one per connection. The
        files are read at each call, so a client that reconnects later picks up a rotated file.

        Raises:
            ConfigError: a file cannot be read (see :func:`read_credentials`, :func:`tls_context`).
        """
        options: dict[str, Any] = {}
        if self.creds:
            creds = read_credentials(self.creds)
            options.update(user=creds.user, password=creds.password, inbox_prefix=connection_inbox_prefix(creds.user))
        if self.tls_ca:
            options["tls"] = tls_context(self.tls_ca)
        return options


ANONYMOUS = BusAccess()
"""No credentials, the system's CAs: what a client without ``VIGIL_NATS_CREDS`` connects as."""


def refusal(exc: BaseException) -> str | None:
    """What ``exc`` means when the bus turned this client away on purpose, with what to do; else ``None``.

    Three refusals: the credentials (``Authorization Violation``: none, or a wrong password), a
    subject these credentials may not use (``Permissions Violation``), and a server certificate
    this client does not trust. Anything else (refused connection, timeout) is not one.
    """
    text = str(exc)
    lowered = text.lower()
    if "authorization violation" in lowered:
        return "the credentials were refused (Authorization Violation); check VIGIL_NATS_CREDS / --creds"
    if "permissions violation" in lowered:
        detail = text.removeprefix("nats: ").strip("'")
        return f"{detail} (these credentials are not for this; use the right role's file)"
    if isinstance(exc, ssl.SSLCertVerificationError):
        trust = "set VIGIL_NATS_TLS_CA to the CA that signed it"
        return f"the broker's TLS certificate is not trusted ({exc.verify_message}); {trust}"
    if "tls required" in lowered:
        return "it requires TLS; use a tls:// URL and set VIGIL_NATS_TLS_CA"
    if isinstance(exc, ssl.SSLError):
        return f"the TLS handshake failed ({exc}); check the broker's certificate and VIGIL_NATS_TLS_CA"
    return None
