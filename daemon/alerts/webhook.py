"""The webhook alert sink: one JSON POST per alert update, never on the ingest path.

Ingest hands updates over with :meth:`WebhookSink.offer`, which never waits: they go into a
bounded queue (:mod:`._queue`), and one worker task posts them, each with a deadline and
retries under the one retry policy (:func:`trainvigil.schemas.settings.retrying`: exponential
backoff from ``alerts.backoff_s``, ``alerts.retries`` further attempts). A slow or dead
webhook therefore only fills the queue, and what leaves it unposted is counted by reason
(``vigil_alert_webhook_dropped_total{reason=...}``, also in ``vigil_alert_webhook_total{outcome="dropped"}``)
and logged:

- ``superseded``: a newer update of the same episode took its place (the newest state is posted);
- ``queue_full``: ``alerts.queue_size`` updates were waiting. Pages go out first and are never
  pushed out by warnings; the update pushed out is the oldest of the run holding the most
  (a warning while any is queued), so a flood from one run only ever costs that run's updates;
- ``stopped``: offered after shutdown began.

What an alert may decide and what it may not: its fields (run ids, messages: an agent can put
anything there) only ever travel inside the JSON body, escaped by ``json.dumps``. In ``text``, the one
field chat receivers render, they are escaped for chat too (:func:`.format.chat_escape`: no mention,
link or markup in them takes effect); the other fields carry them as they were, for programs. The
URL, the method and every header come from the configuration; a redirect is an answer, never followed
(it would carry the body and the credentials elsewhere). Credentials (a bearer token, the
signing key of :mod:`._signing`) are read from files at start-up and never logged: error text
is scrubbed of them and of the URL's path.

HTTP is httpx rather than a hand-written client: it honours ``HTTP(S)_PROXY``/``NO_PROXY``,
checks TLS against the system's CAs (``SSL_CERT_FILE`` applies), parses answers properly and
refuses a header with CR/LF in it; the pure-Python wheels (httpx, httpcore, h11, certifi) are
small. Each attempt also runs under one overall deadline, since httpx's timeouts apply per read.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.parse
from collections.abc import Mapping

import anyio
import httpx
import structlog
from anyio.abc import TaskStatus

from trainvigil.daemon.alerts._queue import AlertQueue
from trainvigil.daemon.alerts._signing import SECRET_KEY, message_id, signature_headers, signing_key
from trainvigil.daemon.alerts.format import as_json, chat_escape, summary
from trainvigil.daemon.config import AlertsConfig, read_secret
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.schemas import Anomaly
from trainvigil.schemas.settings import retrying

log = structlog.get_logger("trainvigil.alerts")

_RETRY_STATUS = frozenset({408, 429})
_TRANSIENT = (httpx.TransportError, OSError)
_OUR_FAULT = (httpx.UnsupportedProtocol, httpx.LocalProtocolError)
"""Transport errors that are about the request itself: trying again cannot help."""


class WebhookError(Exception):
    """One attempt failed. Its text is safe to log (the retry policy logs it too): no credentials, no
    URL path. ``retry``: whether trying again may help."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


class WebhookStatusError(WebhookError):
    """The webhook answered with a status other than 2xx: 5xx, 408 and 429 are worth retrying."""

    def __init__(self, status: int) -> None:
        moved = " (a redirect, not followed: set alerts.webhook_url to where it points)" if 300 <= status < 400 else ""
        super().__init__(f"HTTP {status}{moved}", retry=status >= 500 or status in _RETRY_STATUS)
        self.status = status


def _worth_retrying(exc: Exception) -> bool:
    return isinstance(exc, WebhookError) and exc.retry


def webhook_body(anomaly: Anomaly) -> bytes:
    """The JSON a webhook receives: Slack's ``text`` (escaped for chat) plus every field of the update as it is
    (strict JSON, ASCII)."""
    return json.dumps({"text": chat_escape(summary(anomaly)), **as_json(anomaly)}, allow_nan=False).encode()


def redact(url: str) -> str:
    """``url`` without path and query: Slack-style webhook URLs carry their secret there."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "") + "/..."


def webhook_client(timeout: float) -> httpx.AsyncClient:
    """The one client a sink posts with: no redirects, the system's CAs, proxies from the environment."""
    return httpx.AsyncClient(
        timeout=timeout,
        follow_redirects=False,
        verify=ssl.create_default_context(),
        trust_env=True,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        headers={"User-Agent": "trainvigil"},
    )


async def post_json(
    client: httpx.AsyncClient, url: str, body: bytes, headers: Mapping[str, str], timeout: float
) -> int:
    """POST ``body`` to ``url`` with ``headers``; returns the HTTP status (the answer's body is not read).

    Raises:
        TimeoutError: no status within ``timeout`` seconds, connect included.
        httpx.TransportError: the connection failed or the answer was not HTTP.
    """
    with anyio.fail_after(timeout):
        async with client.stream("POST", url, content=body, headers=headers) as response:
            return response.status_code


class WebhookSink:
    """A bounded queue of alert updates and the worker that posts them.

    Raises (at construction):
        ConfigError: a secret file cannot be read or holds no valid secret.
    """

    def __init__(self, config: AlertsConfig, metrics: DaemonMetrics) -> None:
        self.config = config
        self.metrics = metrics
        token_key = "alerts.webhook_token_file"
        self._token = read_secret(token_key, config.webhook_token_file) if config.webhook_token_file else ""
        secret = read_secret(SECRET_KEY, config.webhook_secret_file) if config.webhook_secret_file else ""
        self._key = signing_key(secret, config.webhook_secret_file) if secret else b""
        self._scrub = {s: "<secret>" for s in (self._token, secret) if s} | {
            config.webhook_url: redact(config.webhook_url)
        }
        self._queue = AlertQueue(config.queue_size)
        self._queued = anyio.Event()
        """Set when an update is queued or the sink stops: the worker waits on it when the queue is empty."""
        self._stopping = False
        self._done = anyio.Event()

    def offer(self, anomaly: Anomaly) -> None:
        """Queue one update for the webhook; never waits (what a full queue drops: see the module's docstring)."""
        if self._stopping:
            self._dropped(anomaly, "stopped")
            return
        for dropped, reason in self._queue.put(anomaly):
            self._dropped(dropped, reason)
        self._queued.set()

    def queued(self) -> list[Anomaly]:
        """The updates waiting, in the order they will be posted."""
        return self._queue.snapshot()

    def _dropped(self, anomaly: Anomaly, reason: str) -> None:
        self.metrics.webhook["dropped"] += 1
        self.metrics.webhook_dropped[reason] += 1
        if reason == "superseded":  # the episode's newer state is queued: nothing is missing
            return
        log.warning(
            "alert_webhook_dropped",
            reason=reason,
            episode=anomaly.episode,
            state=anomaly.state,
            severity=anomaly.severity,
            queue_size=self.config.queue_size,
            hint="the webhook is slower than alerts arrive; check it, or raise alerts.queue_size",
        )

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Post queued updates until :meth:`drain` (or cancellation)."""
        log.info("alert_webhook", url=redact(self.config.webhook_url), signed=bool(self._key), bearer=bool(self._token))
        client = webhook_client(self.config.timeout_s)
        task_status.started()
        try:
            while True:
                anomaly = self._queue.take()
                if anomaly is not None:
                    await self._deliver(client, anomaly)
                elif self._stopping:
                    break
                else:
                    await self._queued.wait()
                    self._queued = anyio.Event()
        finally:
            self._done.set()
            with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                await client.aclose()

    async def drain(self) -> None:
        """Take no more updates; give the queued ones ``drain_s`` seconds to go out."""
        left = len(self._queue)
        self._stopping = True
        self._queued.set()
        with anyio.move_on_after(self.config.drain_s):
            await self._done.wait()
        if not self._done.is_set():
            log.warning("alert_webhook_unsent", queued=left, drain_s=self.config.drain_s)

    def _headers(self, body: bytes, msg_id: str) -> dict[str, str]:
        """Every header of one attempt: all from the configuration, the signature fresh (its timestamp is now)."""
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if self._key:
            headers |= signature_headers(self._key, msg_id, int(time.time()), body)
        return headers

    async def _attempt(self, client: httpx.AsyncClient, body: bytes, msg_id: str) -> None:
        """One POST; any failure becomes a :class:`WebhookError` whose text is scrubbed of the credentials
        and the URL's path, whatever a library put in its own."""
        cfg = self.config
        try:
            status = await post_json(client, cfg.webhook_url, body, self._headers(body, msg_id), cfg.timeout_s)
        except TimeoutError:
            raise WebhookError(f"no answer within {cfg.timeout_s:g} s", retry=True) from None
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:  # refused, reset, DNS, TLS, not HTTP
            text = f"{type(exc).__name__}: {exc}"
            for secret, shown in self._scrub.items():
                text = text.replace(secret, shown)
            raise WebhookError(text, retry=isinstance(exc, _TRANSIENT) and not isinstance(exc, _OUR_FAULT)) from None
        if not 200 <= status < 300:
            raise WebhookStatusError(status)

    async def _deliver(self, client: httpx.AsyncClient, anomaly: Anomaly) -> None:
        cfg = self.config
        body = webhook_body(anomaly)
        msg_id = message_id(body)
        attempts = 0
        try:
            async for attempt in retrying(
                _worth_retrying, attempts=cfg.retries + 1, wait_initial=cfg.backoff_s, wait_max=cfg.backoff_max_s
            ):
                with attempt:
                    if attempts:
                        self.metrics.webhook["retried"] += 1
                    attempts += 1
                    await self._attempt(client, body, msg_id)
        except WebhookError as exc:
            error = str(exc)
        else:
            self.metrics.webhook["sent"] += 1
            return
        self.metrics.webhook["failed"] += 1
        log.warning(
            "alert_webhook_failed",
            url=redact(cfg.webhook_url),
            attempts=attempts,
            error=error,
            episode=anomaly.episode,
            hint="check alerts.webhook_url and that the endpoint accepts JSON POSTs",
        )
