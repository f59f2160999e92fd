"""``vigil up``: the daemon's task group, start-up order and shutdown."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import nats
import nats.errors
import structlog
from anyio.abc import TaskStatus

from .alerts import Alerts
from .config import DaemonConfig
from .http import serve_http
from .ingest import Ingest
from .jetstream import ensure_stream
from .metrics import DaemonMetrics
from .natsserver import port_open, supervise
from .responder import serve_queries
from .store import Store

log = structlog.get_logger("trainvigil.daemon")


async def _resolve_broker(config: DaemonConfig, tg: anyio.abc.TaskGroup) -> str:
    if config.nats_url:
        return config.nats_url
    if port_open("127.0.0.1", config.embedded_port):
        url = f"nats://127.0.0.1:{config.embedded_port}"
        log.info("nats_found", url=url)
        return url
    store_dir = Path(config.data_dir) / "jetstream"
    embedded: str = await tg.start(supervise, config.embedded_port, store_dir)
    return embedded


async def _with_retries(call: Callable[[], Awaitable[object]], attempts: int = 20) -> None:
    """Start-up calls to a broker that may be (re)starting: retry for a while, then give up loudly."""
    for attempt in range(attempts):
        try:
            await call()
            return
        except (nats.errors.Error, TimeoutError) as exc:
            if attempt == attempts - 1:
                raise
            log.warning("broker_not_ready", error=repr(exc), attempt=attempt + 1)
            await anyio.sleep(0.5)


async def _watch_signals(ingest: Ingest) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping", signal=signal.Signals(signum).name)
            ingest.stop()
            return


async def serve(
    config: DaemonConfig,
    *,
    drain: bool = False,
    on_ready: Callable[[str], None] | None = None,
    task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGTERM/SIGINT (or, with ``drain``, until the stream is consumed).

    Start-up order: broker (embedded if needed) → store → stream → HTTP → query responder
    → alerts (webhook worker) → ingest. On a signal the ingest stage finishes the batch in
    hand, commits, acks and publishes its alerts; queued webhook posts get ``alerts.drain_s``;
    everything else is cancelled.
    """
    metrics = DaemonMetrics()
    store = Store(config.db_path, config.stream.consumer, config.stream.name)
    try:
        async with anyio.create_task_group() as tg:
            url = await _resolve_broker(config, tg)

            async def connected() -> None:
                metrics.broker_connected = True

            async def disconnected() -> None:
                metrics.broker_connected = False

            async def quiet_error(exc: Exception) -> None:
                log.debug("nats_error", error=repr(exc))

            nc = await nats.connect(
                url,
                name="trainvigil-daemon",
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,
                connect_timeout=2,
                reconnected_cb=connected,
                disconnected_cb=disconnected,
                error_cb=quiet_error,
            )
            metrics.broker_connected = True
            try:
                js = nc.jetstream()
                await _with_retries(lambda: ensure_stream(js, config.stream))
                if config.http_port:
                    await tg.start(serve_http, config.http_host, config.http_port, metrics)
                await tg.start(serve_queries, nc, store, config, metrics)
                alerts = Alerts(nc, config.alerts, metrics)
                await tg.start(alerts.serve)
                ingest = Ingest(js, store, config, metrics, alerts)
                tg.start_soon(_watch_signals, ingest)
                log.info(
                    "ready",
                    nats_url=url,
                    data_dir=str(config.data_dir),
                    db=str(config.db_path),
                    resume_after_seq=store.last_seq,
                )
                if on_ready is not None:
                    on_ready(url)
                task_status.started(url)
                await ingest.run(drain=drain)
                await alerts.drain()
                tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await nc.close()
    finally:
        store.close()
        log.info("stopped", last_seq=store.last_seq)
