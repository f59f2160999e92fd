"""``vigil up``: the daemon's task group, start-up order and shutdown."""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import anyio
import nats
import nats.errors
import structlog
from anyio.abc import TaskStatus

from trainvigil.daemon.alerts.fanout import Alerts
from trainvigil.daemon.broker.bus import access, embedded_setup
from trainvigil.daemon.broker.embedded import (
    BUNDLED_NAME,
    BrokerUnavailableError,
    marks,
    port_open,
    server_info,
    stop_stray,
    supervise,
)
from trainvigil.daemon.broker.holders import hold
from trainvigil.daemon.broker.jetstream import ensure_stream
from trainvigil.daemon.broker.shards import answer_roll_call, check_partitioning
from trainvigil.daemon.canary import Canaries
from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.ingest.pipeline import Ingest
from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.daemon.store.reads import ReadOnlyQueries
from trainvigil.daemon.store.responder import serve_queries
from trainvigil.daemon.store.writer import Store
from trainvigil.daemon.web.data import DataApi
from trainvigil.daemon.web.http import serve_http
from trainvigil.daemon.web.live import Broadcaster
from trainvigil.errors import ConfigError
from trainvigil.schemas import private
from trainvigil.schemas.natsconnect import BusConnectError, ConnectPolicy, connect
from trainvigil.schemas.natsurl import parse_nats_url
from trainvigil.schemas.redact import redact_url
from trainvigil.schemas.settings import retrying

log = structlog.get_logger("trainvigil.daemon")


async def _resolve_broker(config: DaemonConfig, tg: anyio.abc.TaskGroup) -> str:
    """``nats_url``, else the NATS server on 127.0.0.1:``embedded_port``, else the bundled one started there.

    Raises:
        ConfigError: something that is not a NATS server holds the embedded port.
        BrokerUnavailableError: the bundled nats-server did not start.
    """
    if config.nats_url:
        return config.nats_url
    host, port = "127.0.0.1", config.embedded_port
    mark = marks(Path(config.data_dir))
    if port_open(host, port):
        url = f"nats://{host}:{port}"
        info = await anyio.to_thread.run_sync(server_info, host, port, min(2.0, config.connect_timeout_s))
        if info is None:
            raise ConfigError(
                f"embedded_port: {host}:{port} is held by a program that is not a NATS server; stop it, "
                "pass --embedded-port with a free port, or --nats with your broker's URL",
                key="embedded_port",
            )
        name = str(info.get("server_name", ""))
        if name != mark["name"]:
            if name.startswith(BUNDLED_NAME):  # its own daemon, if up, refuses this one (holders.hold)
                log.warning(
                    "nats_found",
                    url=url,
                    server_name=name,
                    note="the bundled nats-server of another data dir's `vigil up`: it stops with that daemon and this "
                    "one does not restart it; pass --embedded-port to have a broker of this daemon's own",
                )
            else:
                log.info("nats_found", url=url)
            return url
        # Its own data dir's broker, yet this daemon holds the data dir: the daemon that started it is gone.
        # Stopped, not adopted: one of its own is supervised (restarted if it dies) and stops with it.
        pid = await stop_stray(mark, host, port)
        log.warning(
            "stray_nats_server_stopped",
            pid=pid,
            url=url,
            note="a previous `vigil up` on this data dir left its bundled nats-server running; stopped it and "
            "starting one that stops with this daemon",
        )
    store_dir = Path(config.data_dir) / "jetstream"
    setup = embedded_setup(config)
    start = partial(
        supervise,
        port,
        store_dir,
        host=config.embedded_host,
        config_file=setup.config_file,
        scheme=setup.scheme,
        mark=mark,
    )
    embedded: str = await tg.start(start)
    return embedded


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no answer"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _connect(url: str, config: DaemonConfig, metrics: DaemonMetrics) -> nats.NATS:
    """A client that reconnects for ever once connected; the first connection gets ``connect_timeout_s``.

    Raises:
        BrokerUnavailableError: no NATS server answered at ``url`` in time.
        ConfigError: the server turned the daemon's credentials or TLS away (said at once, not retried).
    """

    async def connected() -> None:
        metrics.broker_connected = True

    async def disconnected() -> None:
        metrics.broker_connected = False

    async def quiet_error(exc: Exception) -> None:
        log.debug("nats_error", error=repr(exc))

    policy = ConnectPolicy(
        name="trainvigil-daemon",
        connect_timeout=min(2.0, config.connect_timeout_s),
        deadline=config.connect_timeout_s,
        reconnect=True,  # a cluster's nodes: nats-py picks one and fails over to the others
        reconnect_wait=0.25,
        error_cb=quiet_error,
        disconnected_cb=disconnected,
        reconnected_cb=connected,
    )
    try:
        nc = await connect(parse_nats_url(url), access(config, "daemon"), policy)
    except BusConnectError as exc:
        if exc.refused:  # a wrong password stays wrong: said at once, not retried
            raise ConfigError(
                f"the NATS server at {redact_url(url)} turned the daemon away: {exc.refused}", key="nats_creds"
            ) from None
        raise BrokerUnavailableError(
            f"no NATS server answered at {redact_url(url)} within {config.connect_timeout_s:g} s "
            f"({_describe(exc.cause)}); "
            "start the broker or fix --nats/VIGIL_NATS_URL (VIGIL_CONNECT_TIMEOUT_S sets the wait)",
            url=url,
        ) from None
    metrics.broker_connected = True
    return nc


async def _with_retries(call: Callable[[], Awaitable[object]], url: str, deadline_s: float) -> None:
    """Start-up calls to a broker that may be (re)starting: retried under the one retry policy
    until ``deadline_s``, then given up loudly.

    Raises:
        BrokerUnavailableError: the broker kept failing the call (no JetStream, or not ready).
    """
    failures: list[BaseException] = []
    retried = (nats.errors.Error, TimeoutError)
    try:
        with anyio.fail_after(deadline_s):
            async for attempt in retrying(retried, attempts=None, wait_initial=0.25, wait_max=2.0):
                with attempt:
                    try:
                        await call()
                    except retried as exc:
                        failures.append(exc)
                        log.warning("broker_not_ready", error=repr(exc), attempt=len(failures))
                        raise
    except retried as exc:
        last = failures[-1] if failures else exc
        raise BrokerUnavailableError(
            f"the NATS server at {redact_url(url)} did not set up the stream within {deadline_s:g} s "
            f"({_describe(last)}); is JetStream enabled (nats-server -js)?",
            url=url,
        ) from None


async def _watch_signals(ingest: Ingest, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    # SIGHUP: the terminal that ran `vigil up` closed; drained and stopped like SIGTERM, the broker with it.
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        # Started (and so "ready" announced) only once the handlers are in: a signal sent on "ready" must not
        # meet the default action, which kills the daemon without draining.
        task_status.started()
        async for signum in signals:
            log.info("stopping", signal=signal.Signals(signum).name)
            ingest.stop()
            return


async def _watch_event(ingest: Ingest, stop: anyio.Event) -> None:
    """A daemon embedded in another program (the tests' in-process daemon) stops when it is told, like on SIGTERM."""
    await stop.wait()
    log.info("stopping", signal=None)
    ingest.stop()


async def _serve_web(
    config: DaemonConfig,
    metrics: DaemonMetrics,
    store: Store,
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """The HTTP side with the web view: its data read through ``vigil sql``'s read-only path, live
    updates fed by the store's commits."""
    live = Broadcaster()
    store.on_commit = live.committed
    queries = ReadOnlyQueries(store, config).answer
    api = DataApi(queries, config.query_concurrency, lambda: live.generation, metrics.web_queries)
    try:
        await serve_http(
            config.http_host,
            config.http_port,
            metrics,
            config.http_token_file,
            allowed_hosts=config.allowed_hosts,
            api=api,
            live=live,
            task_status=task_status,
        )
    finally:
        store.on_commit = None


async def serve(
    config: DaemonConfig,
    *,
    drain: bool = False,
    on_ready: Callable[[str], None] | None = None,
    stop: anyio.Event | None = None,
    task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGTERM/SIGINT/SIGHUP (or, with ``drain``, until the stream is consumed).

    ``stop``: instead of the signals (which only a program's main thread receives), the daemon stops
    when this event is set, as it does on SIGTERM: a daemon run in a thread of another program.

    Start-up order: broker (embedded if needed) → store → claim of the stream and consumer (one
    daemon per broker, :mod:`~trainvigil.daemon.broker.holders`) → stream → HTTP → query responder
    → alerts (webhook worker) → canaries (trigger, schedule) → ingest. On a signal the ingest
    stage finishes the batch in hand, commits, acks and publishes its alerts; queued webhook
    posts get ``alerts.drain_s``; everything else is cancelled (running canaries are killed and
    recorded ``aborted``).

    A shard (``config.shard``) first checks that the broker partitions runs over its count, then
    uses its own stream and consumer (:meth:`DaemonConfig.for_shard`), answers queries on its own
    subject and the roll call, and runs the canaries whose runs it owns.
    """
    config = config.for_shard()
    shard = config.shard_id
    metrics = DaemonMetrics()
    # While it runs, everything the daemon creates is its own (schemas/private.py): files of DuckDB's, the WAL
    # made again after each checkpoint by whichever thread commits, can only be made private by the umask.
    umask = os.umask(private.UMASK)
    try:
        store = Store(
            config.db_path,
            config.stream.consumer,
            config.stream.name,
            min_free_bytes=config.store.min_free_bytes,
            memory_limit_bytes=config.store.memory_limit_bytes,
            duplicate_window_s=config.stream.duplicate_window_s,
        )
    except BaseException:
        os.umask(umask)
        raise
    try:
        async with anyio.create_task_group() as tg:
            url = await _resolve_broker(config, tg)
            nc = await _connect(url, config, metrics)
            try:
                js = nc.jetstream()
                if shard is not None:
                    await check_partitioning(nc, shard, url)
                # Before the stream and the consumer are touched: binding the consumer evicts its holder.
                await tg.start(partial(hold, nc, config, url, metrics))
                subjects = config.stream_subjects
                await _with_retries(lambda: ensure_stream(js, config.stream, subjects), url, config.connect_timeout_s)
                if config.http_port:
                    await tg.start(_serve_web, config, metrics, store)
                alerts = Alerts(nc, config.alerts, metrics, config.subjects)
                if shard is None:
                    await tg.start(serve_queries, nc, store, config, metrics)
                    await tg.start(alerts.serve)
                else:
                    # A shard answers queries on its own subject only (``vigil sql`` gathers every
                    # shard's, never one shard's alone).
                    await tg.start(partial(serve_queries, nc, store, config, metrics, subject=shard.query_subject))
                    await tg.start(answer_roll_call, nc, shard, metrics)
                    await tg.start(alerts.serve)
                # A shard runs the canaries whose runs it owns (see trainvigil.daemon.canary.service).
                await tg.start(Canaries(nc, store, config, metrics, alerts, url).serve)
                ingest = Ingest(js, store, config, metrics, alerts)
                if stop is None:
                    await tg.start(_watch_signals, ingest)
                else:
                    tg.start_soon(_watch_event, ingest, stop)
                log.info(
                    "ready",
                    nats_url=redact_url(url),
                    shard=str(shard) if shard else None,
                    namespace=config.namespace or None,
                    stream=config.stream.name,
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
        os.umask(umask)
        log.info("stopped", last_seq=store.last_seq)
