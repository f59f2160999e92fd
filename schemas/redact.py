"""NATS URLs as they may be shown: a password or token in one never reaches a terminal or a log.

``nats://user:password@host`` and ``nats://token@host`` carry their secret in the URL's userinfo. Every message and
log line that names a broker shows :func:`redact_url` of it instead; connecting uses the URL as given. Agent and
daemon share this function: both print the URLs they were configured with.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "redact_url"]

MASK = "***"
"""What a secret reads as."""

# A URL's authority runs from its ``scheme://`` to the first '/', '?', '#', whitespace or comma (the separator of a
# cluster's list); its userinfo ends at the authority's last '@' (as urlsplit reads it), so an unescaped '@' in a
# password is hidden with the rest. Regular expressions, not urlsplit: a malformed URL, which error messages quote
# back, and URLs inside other text are redacted as well.
_IN_TEXT = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#\s,]*)")
_BARE = re.compile(r"(?P<head>\s*)(?P<authority>[^/?#\s,]*)")
"""A list's part without a scheme (``HOST:PORT``, which nats-py reads as ``nats://HOST:PORT``)."""


def _hidden(match: re.Match[str]) -> str:
    head, authority = match.group("head", "authority")
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return match.group(0)
    user, colon, _ = userinfo.partition(":")
    # ``user:password``: the user stays (it says which account); a lone user part is a token (nats-py reads it so).
    return f"{head}{f'{user}:{MASK}' if colon else MASK}@{host}"


def _redact_part(part: str) -> str:
    if "://" in part:
        return _IN_TEXT.sub(_hidden, part)
    return _BARE.sub(_hidden, part, count=1)


def redact_url(url: str) -> str:
    """``url`` (one NATS URL, several comma-separated, or text with URLs in it) with the password or token of each
    URL replaced by ``***``.

    Everything else is kept as written: ``nats://alice:s3cret@h1:4222, tls://tok@h2`` reads
    ``nats://alice:***@h1:4222, tls://***@h2``. Redacting twice changes nothing; never raises.
    """
    return ",".join(_redact_part(part) for part in url.split(","))
