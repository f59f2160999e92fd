"""The webhook alert sink: one JSON POST per alert update, never on the ingest path.

Ingest hands updates over with :meth:`WebhookSink.offer`, which never waits: they go into a
bounded memory stream, and one worker task posts them in order, each with a timeout and
retries under the one retry policy (:func:`trainvigil.schemas.settings.retrying`: exponential
backoff from ``alerts.backoff_s``, ``alerts.retries`` further attempts). A slow or dead
webhook therefore only fills the queue; once it is full the **oldest** queued update is
dropped (the newer state of an incident is the more useful one), counted as
``vigil_alert_webhook_total{outcome="dropped"}`` and logged.

The body is Slack-compatible: ``{"text": "<one line>", ...every Anomaly field}``. HTTP is a
minimal HTTP/1.1 client on anyio streams (TLS for ``https://``), so a hung server is
cancelled cleanly by the timeout and by shutdown; proxies are not supported.
"""

from __future__ import annotations

import json
import urllib.parse

import anyio
import structlog
from anyio.abc import ByteStream, TaskStatus

from trainvigil.daemon.alerts.format import as_json, summary
from trainvigil.daemon.config import AlertsConfig
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.schemas import Anomaly
from trainvigil.schemas.settings import retrying

log = structlog.get_logger("trainvigil.alerts")

_RETRY_STATUS = frozenset({408, 429})


class WebhookResponseError(OSError):
    """The server closed the connection or answered something that is not HTTP."""


class WebhookStatusError(Exception):
    """The webhook answered with a status other than 2xx; ``retry``: whether trying again may help."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry = status >= 500 or status in _RETRY_STATUS


def _worth_retrying(exc: Exception) -> bool:
    """Connection errors, timeouts, 5xx, 408 and 429; not a request the server refused as wrong."""
    return isinstance(exc, OSError | TimeoutError) or (isinstance(exc, WebhookStatusError) and exc.retry)


def webhook_body(anomaly: Anomaly) -> bytes:
    """The JSON a webhook receives: Slack's ``text`` plus every field of the update."""
    return json.dumps({"text": summary(anomaly), **as_json(anomaly)}).encode()


def redact(url: str) -> str:
    """``url`` without path and query: Slack-style webhook URLs carry their secret there."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "") + "/..."


async def post_json(url: str, body: bytes, timeout: float) -> int:
    """POST ``body`` as JSON to ``url``; returns the HTTP status code.

    Raises:
        TimeoutError: no status line within ``timeout`` seconds (connect included).
        OSError: the connection failed or the answer was not HTTP.
    """
    parts = urllib.parse.urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = (
        f"POST {target} HTTP/1.1\r\nHost: {parts.netloc.rpartition('@')[2]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "User-Agent: trainvigil\r\nConnection: close\r\n\r\n"
    )
    port = parts.port or (443 if tls else 80)
    with anyio.fail_after(timeout):
        stream: ByteStream = await (
            # Lenient TLS closing: many servers drop the connection without a close_notify.
            anyio.connect_tcp(host, port, tls=True, tls_standard_compatible=False)
            if tls
            else anyio.connect_tcp(host, port)
        )
        async with stream:
            data = b""
            try:
                await stream.send(head.encode() + body)
                while b"\r\n" not in data and len(data) <= 8192:
                    data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                raise WebhookResponseError(f"connection closed before an answer: {data!r}") from None
    status_line = data.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/") or not status_line[1].isdigit():
        raise WebhookResponseError(f"not an HTTP answer: {data[:80]!r}")
    return int(status_line[1])


class WebhookSink:
    """A bounded queue of alert updates and the worker that posts them."""

    def __init__(self, config: AlertsConfig, metrics: DaemonMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self._send, self._receive = anyio.create_memory_object_stream[Anomaly](config.queue_size)
        self._done = anyio.Event()

    def offer(self, anomaly: Anomaly) -> None:
        """Queue one update for the webhook; never waits (a full queue drops its oldest update)."""
        while True:
            try:
                self._send.send_nowait(anomaly)
                return
            except anyio.WouldBlock:
                dropped = self._receive.receive_nowait()  # full, so there is one to take
                self._dropped(dropped, "queue_full")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._dropped(anomaly, "stopped")
                return

    def _dropped(self, anomaly: Anomaly, reason: str) -> None:
        self.metrics.webhook["dropped"] += 1
        log.warning(
            "alert_webhook_dropped",
            reason=reason,
            episode=anomaly.episode,
            state=anomaly.state,
            queue_size=self.config.queue_size,
            hint="the webhook is slower than alerts arrive; check it, or raise alerts.queue_size",
        )

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Post queued updates until :meth:`drain` (or cancellation)."""
        log.info("alert_webhook", url=redact(self.config.webhook_url))
        task_status.started()
        try:
            async with self._receive:
                async for anomaly in self._receive:
                    await self._deliver(anomaly)
        finally:
            self._done.set()

    async def drain(self) -> None:
        """Take no more updates; give the queued ones ``drain_s`` seconds to go out."""
        left = self._send.statistics().current_buffer_used
        self._send.close()
        with anyio.move_on_after(self.config.drain_s):
            await self._done.wait()
        if not self._done.is_set():
            log.warning("alert_webhook_unsent", queued=left, drain_s=self.config.drain_s)

    async def _deliver(self, anomaly: Anomaly) -> None:
        cfg = self.config
        body = webhook_body(anomaly)
        attempts = 0
        try:
            async for attempt in retrying(
                _worth_retrying, attempts=cfg.retries + 1, wait_initial=cfg.backoff_s, wait_max=cfg.backoff_max_s
            ):
                with attempt:
                    if attempts:
                        self.metrics.webhook["retried"] += 1
                    attempts += 1
                    status = await post_json(cfg.webhook_url, body, cfg.timeout_s)
                    if not 200 <= status < 300:
                        raise WebhookStatusError(status)
        except TimeoutError:
            error = f"no answer within {cfg.timeout_s:g} s"
        except (OSError, WebhookStatusError) as exc:  # refused, reset, DNS, TLS (ssl errors are OSErrors), not HTTP
            error = str(exc) if isinstance(exc, WebhookStatusError) else repr(exc)
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
