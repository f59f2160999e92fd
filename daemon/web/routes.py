"""The daemon's ASGI app: ``/healthz``, ``/metrics``, the pages, their data (``/api/*``) and live events.

``/healthz`` and ``/metrics`` are always there; the pages, data and live events only when the
daemon hands over its read-only query runner and its commit broadcaster.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from trainvigil.daemon.metrics import DaemonMetrics
from trainvigil.daemon.web import pages
from trainvigil.daemon.web.assets import Assets
from trainvigil.daemon.web.auth import BearerAuth
from trainvigil.daemon.web.budget import CpuSaturated, HttpBudget
from trainvigil.daemon.web.data import BadRequestError, DataApi, JSONResponse
from trainvigil.daemon.web.headers import SecurityHeaders
from trainvigil.daemon.web.hosts import HostCheck, HostPolicy
from trainvigil.daemon.web.live import Broadcaster, sse_events


def health(metrics: DaemonMetrics) -> tuple[int, dict[str, Any]]:
    """``/healthz``'s status code and body: 503 and the reasons while the daemon is degraded."""
    broker = "" if metrics.broker_connected else "broker_disconnected"
    reasons = [r for r in (broker, metrics.stuck, metrics.store_unavailable) if r]
    body: dict[str, Any] = {
        "status": "degraded" if reasons else "ok",
        "broker_connected": metrics.broker_connected,
        "last_seq": metrics.last_seq,
        "consumer_lag": metrics.consumer_lag,
    }
    if reasons:
        body["reasons"] = reasons
    return (503 if reasons else 200), body


def build_app(
    metrics: DaemonMetrics,
    token: bytes = b"",
    api: DataApi | None = None,
    live: Broadcaster | None = None,
    *,
    hosts: HostPolicy | None = None,
) -> Starlette:
    """The app; ``token``: the bearer token every path but ``/healthz`` needs (empty: none); ``hosts``: the
    ``Host`` names answered (``None``: any, for an app served in process, without a listener)."""

    async def healthz(request: Request) -> Response:
        status, body = health(metrics)
        return Response(json.dumps(body), status_code=status, media_type="application/json")

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    routes: list[Route] = [
        Route("/healthz", healthz, methods=["GET", "HEAD"]),
        Route("/metrics", prometheus, methods=["GET", "HEAD"]),
    ]
    if api is not None:
        routes += [
            Route("/", pages.runs_page),
            Route("/run", pages.run_page),
            Route("/compare", pages.compare_page),
            Route("/alerts", pages.alerts_page),
            Route("/api/runs", api.runs),
            Route("/api/run", api.run),
            Route("/api/series", api.series),
            Route("/api/run/series", api.run_series),
            Route("/api/compare", api.compare),
            Route("/api/episodes", api.episodes),
            Route("/api/events", api.events),
            Route("/api/anomalies", api.anomalies),
            Route("/static/{name}", Assets().serve, methods=["GET", "HEAD"]),
        ]
    if live is not None:

        async def events(request: Request) -> Response:
            headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
            return StreamingResponse(sse_events(live), media_type="text/event-stream", headers=headers)

        routes.append(Route("/api/live", events))

    async def not_found(request: Request, exc: Exception) -> Response:
        hint = "try /healthz or /metrics" + (" or / for the runs" if api is not None else "")
        return PlainTextResponse(f"{hint}\n", status_code=404)

    async def bad_request(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=400)

    # While a heavy ingest has the cores saturated, the web view yields to it (.budget).
    budget: list[Middleware] = []
    if live is not None:
        saturated = CpuSaturated()

        def strained() -> bool:
            return live.busy() and saturated()

        live.strain_when(strained)  # fewer live ticks
        budget = [Middleware(HttpBudget, busy=strained)]  # and a bounded share for the requests
    # Outermost first: every answer gets the headers, a refused Host costs no budget and learns nothing.
    checked = [Middleware(HostCheck, policy=hosts)] if hosts is not None else []
    return Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders), *checked, *budget, Middleware(BearerAuth, token=token)],
        exception_handlers={404: not_found, BadRequestError: bad_request},
    )
