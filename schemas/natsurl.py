"""The one reading of a NATS URL setting, shared by the agent, the daemon and every ``vigil`` command.

A setting (``VIGIL_NATS_URL``, ``--nats``, ``nats_url``) names one broker or a cluster's nodes, comma-separated;
each is a ``nats://``, ``tls://``, ``ws://`` or ``wss://`` URL, or ``HOST:PORT`` (read as ``nats://HOST:PORT``, as
nats-py reads it). nats-py takes the nodes as a list (a string with commas is one malformed server to it), so
clients connect with :attr:`NatsUrl.servers`. Like :mod:`.credentials`, this sits in ``schemas`` without being a
wire type, because both sides read the same setting.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

from trainvigil.errors import ConfigError

from .redact import redact_url

__all__ = ["NATS_URL_KEY", "SCHEMES", "NatsUrl", "parse_nats_url"]

SCHEMES = frozenset({"nats", "tls", "ws", "wss"})
NATS_URL_KEY = "nats_url (VIGIL_NATS_URL)"
"""How a refusal names the setting unless the caller says where the URL came from."""


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class NatsUrl:
    """A checked NATS URL setting; build it with :func:`parse_nats_url`.

    ``str()`` and ``repr()`` hide every password and token (:func:`~.redact.redact_url`); two spellings of one list
    (``h1:1, nats://h2:2`` and ``nats://h1:1,nats://h2:2``) are equal.
    """

    servers: tuple[str, ...]
    """Each node with its scheme, in the order given: what ``nats.connect`` takes (secrets included)."""
    url: str = dataclasses.field(default="", compare=False)
    """The setting as written."""

    @property
    def websocket(self) -> bool:
        """Whether the nodes are reached over websockets (``ws://``, ``wss://``; a list never mixes the two kinds)."""
        return self.servers[0].startswith(("ws://", "wss://"))

    @property
    def has_user(self) -> bool:
        """Whether a node's URL carries a user or token of its own (then the client is not anonymous)."""
        return any(urlsplit(server).username for server in self.servers)

    def __str__(self) -> str:
        return redact_url(",".join(self.servers))

    def __repr__(self) -> str:
        return f"NatsUrl({str(self)!r})"


def _checked(part: str) -> str | None:
    """``part`` with its scheme, or ``None`` when it is not a NATS URL nor ``HOST:PORT``."""
    full = part if "://" in part else f"nats://{part}"
    try:
        parts = urlsplit(full)
        # Without a scheme a port is required: a lone word is a typo more often than a host name.
        ok = parts.scheme in SCHEMES and bool(parts.hostname) and parts.port != 0
        ok = ok and (parts.port is not None or full == part)
    except ValueError:  # a port that is not a number, or out of range
        ok = False
    return full if ok else None


def parse_nats_url(url: str, key: str = NATS_URL_KEY) -> NatsUrl:
    """``url`` (one node or several, comma-separated) checked, each node given its scheme.

    Args:
        key: the setting ``url`` came from, as a refusal names it (``--nats / VIGIL_NATS_URL``).

    Raises:
        ConfigError: a part is not ``nats://``, ``tls://``, ``ws://`` or ``wss://`` with a host and an (optional)
            port from 1 to 65535, nor ``HOST:PORT``; or websocket and plain URLs are mixed. The message quotes
            the URL without its passwords.
    """
    servers = []
    for part in (p.strip() for p in url.split(",")):
        full = _checked(part)
        if full is None:
            shown = redact_url(url)  # quoted back: never its password
            what = f"is {shown!r}" if part == url.strip() else f"{shown!r} holds {redact_url(part)!r}"
            raise ConfigError(
                f"{key} {what}, not a NATS URL: use nats://HOST:PORT (or tls://, ws://, wss://, HOST:PORT), "
                "several comma-separated",
                key="nats_url",
            )
        servers.append(full)
    if len({s.startswith(("ws://", "wss://")) for s in servers}) > 1:
        raise ConfigError(
            f"{key} {redact_url(url)!r} mixes websocket and plain NATS URLs; use one kind", key="nats_url"
        )
    return NatsUrl(tuple(servers), url)
