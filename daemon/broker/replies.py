"""Where the daemon answers a request: in an inbox of a role that may ask, never on a subject the asker names.

A request carries its own reply subject, and the daemon publishes its answer there with its own rights,
which are everything in the account. Left unchecked, a reader (who may send queries and nothing else)
could have the daemon publish a large answer into the stream (``vigil.v1.<run>.metrics``: stored for
good, as a dead letter of someone's run), forge an alert (``vigil.v1.alerts.<run>``), send a control
request, or call the JetStream or system API (``$JS.API.…``, ``$SYS.…``) in the daemon's name. So every
responder (SQL, the shards' roll call and queries, canary triggers) asks :class:`Replies` first, and
answers only on an inbox:

- on a bus with users, ``_INBOX.<user>.…`` of a user that may ask (:data:`ASKERS`: the reader's, and the
  daemon's own for ``vigil canary run``), which the server lets no other user read
  (:func:`~trainvigil.schemas.credentials.inbox_prefix`);
- on an open bus, any ``_INBOX.…`` (anyone may publish anywhere there anyway; this keeps the daemon
  from writing into its own stream).

A refused request is not answered (nor run), counted in ``vigil_replies_refused_total{responder}``,
and logged as one line a second at most, with how many were refused since the line before.

The asker (:meth:`Replies.asker`) is the inbox's first token under the role's prefix, cut to the 12
characters that nats-py keeps for one connection: ``new_inbox()`` is ``<prefix>.<NUID>``, and a NUID's
first 12 characters (random bytes) stay the same for every inbox of one connection, only the last 10 count
up; ``request()`` answers arrive under ``<prefix>.<NUID>.<token>``, the same. A client that makes up
inboxes gets a new asker each time: :class:`~trainvigil.daemon.broker.ratelimit.Buckets` caps them.
"""

from __future__ import annotations

import structlog
from nats.aio.client import Client as NATS

from trainvigil.daemon.broker.ratelimit import Tally
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.schemas.credentials import INBOX_ROOT, inbox_prefix

log = structlog.get_logger("trainvigil.replies")

ASKERS = ("reader", "daemon")
"""The users (as ``vigil auth`` names them: their roles) whose inboxes the daemon answers in."""
ASKER_CHARS = 12
"""Of the token after the prefix, the characters that name one connection (a NUID's random prefix)."""
MAX_REPLY = 256
"""A longer reply subject is no inbox a client library makes."""


def inbox_prefixes(secured: bool) -> tuple[str, ...]:
    """The reply subject prefixes the daemon answers on: the askers' inboxes on a bus with users, else any inbox."""
    if secured:
        return tuple(f"{inbox_prefix(user)}." for user in ASKERS)
    return (f"{INBOX_ROOT}.",)


def asker_of(reply: str, prefixes: tuple[str, ...]) -> str | None:
    """Who asked, when ``reply`` is an inbox under one of ``prefixes``: the prefix and the connection's part
    of the next token (see the module's docstring); ``None`` for anything else, wildcards included."""
    if len(reply) > MAX_REPLY:
        return None
    for prefix in prefixes:
        if reply.startswith(prefix):
            tokens = reply[len(prefix) :].split(".")
            if any(not t or t in ("*", ">") or not t.isprintable() or " " in t for t in tokens):
                return None
            return prefix + tokens[0][:ASKER_CHARS]
    return None


def secured(nc: NATS) -> bool:
    """Whether the server ``nc`` is connected to requires credentials (its INFO says ``auth_required``)."""
    # nats-py keeps the server's INFO private; it is updated at every (re)connect, to whichever node.
    info = getattr(nc, "_server_info", None) or {}
    return bool(info.get("auth_required"))


class Replies:
    """The reply check of one responder (``responder``: its name in the metric and the log)."""

    def __init__(self, nc: NATS, metrics: DaemonMetrics, responder: str) -> None:
        self.nc = nc
        self.metrics = metrics
        self.responder = responder
        self._refused = Tally(log, "reply_refused")

    def asker(self, reply: str) -> str | None:
        """Who asked, when the daemon may answer on ``reply``; else ``None``, counted and logged (rate-limited).

        ``reply`` empty (a request that wants no answer) is refused too: a responder never does work
        whose answer goes nowhere.
        """
        who = asker_of(reply, inbox_prefixes(secured(self.nc))) if reply else None
        if who is None:
            self.metrics.replies_refused[self.responder] += 1
            self._refused.add(
                responder=self.responder,
                reply=reply[:MAX_REPLY] or None,
                why="requests are answered in an inbox of a user that may ask (_INBOX.<user>.…), never elsewhere",
            )
        return who
