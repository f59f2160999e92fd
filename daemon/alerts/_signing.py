"""How a webhook receiver knows a post came from this daemon, unchanged and recently: Standard Webhooks.

The scheme is `Standard Webhooks <https://www.standardwebhooks.com>`_ (Svix and others), so a
receiver may verify with that project's libraries or with ten lines of its own (docs/operations/security.md):

- ``webhook-id``: ``msg_`` + a digest of the body; the same for every retry of one update, so a
  receiver can drop a repeat it already took.
- ``webhook-timestamp``: Unix seconds of the attempt (each retry is signed afresh), so a receiver
  can refuse a captured post replayed later (the scheme suggests a 5-minute tolerance).
- ``webhook-signature``: ``v1,`` + base64 of HMAC-SHA256(key, ``"<id>.<timestamp>.<body>"``) over the
  exact bytes sent.

The key is the base64 text of the secret file, after an optional ``whsec_`` prefix, decoded: the
libraries' convention. Pure functions: the sink adds the headers, tests verify them independently.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

from trainvigil.errors import ConfigError

SECRET_KEY = "alerts.webhook_secret_file"
MIN_KEY_BYTES = 24
"""The scheme's lower bound for a key (192 bits)."""
_MAKE_ONE = "import base64, secrets; print('whsec_' + base64.b64encode(secrets.token_bytes(32)).decode())"


def signing_key(secret: str, path: str) -> bytes:
    """The HMAC key a ``whsec_<base64>`` (or bare base64) secret, read from ``path``, stands for.

    Raises:
        ConfigError: not base64, or shorter than :data:`MIN_KEY_BYTES`; the secret is never in the message.
    """
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        key = b""
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(
            f"{SECRET_KEY} (VIGIL_ALERTS_WEBHOOK_SECRET_FILE): {path} must hold whsec_ and the base64 of at least "
            f"{MIN_KEY_BYTES} random bytes; make one with: "
            f"python -c {_MAKE_ONE!r}",
            key=SECRET_KEY,
        )
    return key


def message_id(body: bytes) -> str:
    """``webhook-id``: stable for one update across retries, different for different updates."""
    return "msg_" + hashlib.sha256(body).hexdigest()[:32]


def signature_headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for ``body`` sent at ``timestamp`` (Unix seconds)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": f"v1,{digest}"}
