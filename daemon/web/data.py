"""The JSON data endpoints of the web view: every answer is a read-only query through the daemon's query path.

``Ask`` is the one way in: the daemon hands the web view its read-only query runner (the one
``vigil sql`` uses, with its limits), so the web has no database handle of its own. At most
``concurrency`` web queries run at once; the rest wait their turn.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse as _StarletteJSON
from starlette.responses import Response

from trainvigil.daemon.web import inputs, sql
from trainvigil.daemon.web.budget import charge, off_the_clock
from trainvigil.daemon.web.cache import SharedAnswers
from trainvigil.schemas import KNOWN_METRICS
from trainvigil.schemas.query import QueryRequest, QueryResult

Ask = Callable[[QueryRequest], Awaitable[QueryResult]]
MAX_COMPARE = 10
MAX_SERIES_METRICS = 16
"""Metrics one ``/api/run/series`` request may name: a screenful of charts (the page asks in batches of it)."""


class JSONResponse(_StarletteJSON):
    """JSON written by msgspec: a NaN or infinite value (a non-finite loss in an alert) becomes ``null``."""

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


class BadRequestError(ValueError):
    """A request parameter the endpoint cannot use (answered 400)."""


def _records(result: QueryResult) -> list[dict[str, Any]]:
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def _int(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name, "")
    if not raw:
        return None
    try:
        return int(float(raw))
    except (ValueError, OverflowError):  # "x", "nan", "inf"
        raise BadRequestError(f"{name} must be a number, not {raw!r}") from None


def _ranks(request: Request) -> list[int]:
    """``ranks=0,2``: the ranks named (anything but digits is skipped)."""
    return [int(r) for r in request.query_params.get("ranks", "").split(",") if r.strip().isdigit()]


def _required(request: Request, name: str) -> str:
    value = request.query_params.get(name, "")
    if not value:
        raise BadRequestError(f"the {name} parameter is required")
    return value


class Encoded(NamedTuple):
    """An answer as it goes on the wire: its status code and its JSON body."""

    status: int
    body: bytes


def _error(result: QueryResult) -> Encoded:
    # A refused query is the request's fault (400); a query that failed or timed out is the daemon's (503).
    return Encoded(400 if result.refused else 503, msgspec.json.encode({"error": result.error}))


def _rows(result: QueryResult) -> Encoded:
    return Encoded(200, msgspec.json.encode({"rows": _records(result), "truncated": result.truncated}))


def _run_info(run_id: str) -> Callable[[QueryResult], Encoded]:
    def shape(result: QueryResult) -> Encoded:
        if not result.rows:
            return Encoded(404, msgspec.json.encode({"error": f"no run {run_id!r}"}))
        info = _records(result)[0]
        info["metrics"] = [m for m in KNOWN_METRICS if info.pop(m)] + list(info.pop("custom") or [])
        info["feeds"] = inputs.feeds(info["metrics"], _names(info.pop("compat_names")))
        info["unfed"] = inputs.unfed(info["metrics"])
        return Encoded(200, msgspec.json.encode(info))

    return shape


_NAMES = msgspec.json.Decoder(dict[str, str])


def _names(text: str | None) -> dict[str, str]:
    """A run's ``names=`` mapping as its ``compat_names`` event carried it; none when it is missing or malformed
    (the built-in mapping still applies)."""
    if not text:
        return {}
    try:
        return _NAMES.decode(text)
    except msgspec.DecodeError:
        return {}


def _series(metric: str, compare: bool = False) -> Callable[[QueryResult], Encoded]:
    def shape(result: QueryResult) -> Encoded:
        series: dict[str, dict[str, Any]] = sql.points(result.rows)
        if compare:
            _name_run_and_rank(series)
        return Encoded(200, msgspec.json.encode({"metric": metric, "series": series, "truncated": result.truncated}))

    return shape


def _series_of(metrics: list[str]) -> Callable[[QueryResult], Encoded]:
    def shape(result: QueryResult) -> Encoded:
        found = sql.points_by_metric(result.rows)
        answer = {m: found.get(m, {}) for m in metrics}  # a metric without points: no series, not missing
        return Encoded(200, msgspec.json.encode({"metrics": answer, "truncated": result.truncated}))

    return shape


def _name_run_and_rank(series: dict[str, dict[str, Any]]) -> None:
    """Compare's series keys are ``<rank>:<run id>``; each series also says its run and rank (for the legend)."""
    for key, points in series.items():
        rank, _, run_id = key.partition(":")
        points["run"], points["rank"] = run_id, int(rank)


class DataApi:
    """The handlers of ``/api/*``.

    Between two commits an answer cannot change, and many open pages ask the same questions, so each
    distinct question is answered once per commit generation: run, *shaped and JSON-encoded* once, its
    bytes handed to every request of that generation (:class:`.cache.SharedAnswers`). Building the
    answer (rows to series, JSON) holds the GIL the ingest needs; doing it per request cost more than
    the query itself under load.
    """

    def __init__(
        self,
        ask: Ask,
        concurrency: int = 2,
        generation: Callable[[], int] = lambda: 0,
        counts: Counter[str] | None = None,
    ) -> None:
        """``generation``: the count of commits so far (:attr:`.live.Broadcaster.generation`); a query
        runs once per distinct text and generation, its answer shared by every request that asks it.
        ``counts``: queries run, by endpoint (:attr:`.DaemonMetrics.web_queries`)."""
        self._ask = ask
        self.counts: Counter[str] = Counter() if counts is None else counts
        self._slots = anyio.CapacityLimiter(concurrency)
        self._shared: SharedAnswers[Encoded] = SharedAnswers(generation)

    async def _answer(
        self, kind: str, text: str, shape: Callable[[QueryResult], Encoded], limit: int = sql.MAX_ROWS
    ) -> Response:
        """The encoded answer to ``text`` shaped by ``shape``; ``kind`` (the endpoint) keys it with the text."""

        async def build() -> Encoded:
            self.counts[kind] += 1
            async with off_the_clock(), self._slots:
                started = time.monotonic()
                result = await self._ask(QueryRequest(sql=text, limit=limit))
                charge(time.monotonic() - started)
            return _error(result) if result.error else shape(result)

        encoded = await self._shared.get((kind, text, limit), build)
        return Response(encoded.body, encoded.status, media_type="application/json")

    async def runs(self, request: Request) -> Response:
        return await self._answer("runs", sql.runs(), _rows)

    async def run(self, request: Request) -> Response:
        run_id = _required(request, "id")
        return await self._answer("run", sql.run_info(run_id), _run_info(run_id))

    async def series(self, request: Request) -> Response:
        run_id, metric = _required(request, "id"), _required(request, "metric")
        ranks = _ranks(request)
        lo, hi = _int(request, "lo"), _int(request, "hi")
        n = sql.bucket_count(len(ranks) or _int(request, "nranks") or 1)
        return await self._answer("series", sql.run_series(run_id, metric, ranks, lo, hi, n), _series(metric))

    async def run_series(self, request: Request) -> Response:
        """Several metrics of one run in one query (``metric=a&metric=b``, up to :data:`MAX_SERIES_METRICS`):
        ``{"metrics": {name: series as /api/series gives them}, "truncated": ...}``. Every series of the
        answer gets the buckets one of ``metrics x ranks`` series gets, so an answer stays as large as one
        of ``/api/series`` with that many ranks."""
        run_id = _required(request, "id")
        metrics = list(dict.fromkeys(m for m in request.query_params.getlist("metric") if m))
        if not metrics:
            raise BadRequestError("name at least one metric: ?id=RUN&metric=loss&metric=lr")
        if len(metrics) > MAX_SERIES_METRICS:
            raise BadRequestError(f"at most {MAX_SERIES_METRICS} metrics per request, not {len(metrics)}")
        ranks = _ranks(request)
        lo, hi = _int(request, "lo"), _int(request, "hi")
        n = sql.bucket_count(len(metrics) * (len(ranks) or _int(request, "nranks") or 1))
        text = sql.run_series_of(run_id, metrics, ranks, lo, hi, n)
        return await self._answer("run_series", text, _series_of(metrics))

    async def compare(self, request: Request) -> Response:
        """``metric`` of up to 10 runs, rank 0 of each unless ``ranks`` names others (``0,1`` or ``all``)."""
        run_ids = list(dict.fromkeys(r for r in request.query_params.getlist("id") if r))[:MAX_COMPARE]
        if not run_ids:
            raise BadRequestError("name at least one run: ?id=A&id=B (up to 10)")
        metric = _required(request, "metric")
        every = request.query_params.get("ranks", "").strip() == "all"
        ranks = [] if every else (_ranks(request) or [0])
        lo, hi = _int(request, "lo"), _int(request, "hi")
        # With every rank the page says how many series to expect (nseries); budget the buckets for them.
        n = sql.bucket_count(_int(request, "nseries") or len(run_ids) * max(1, len(ranks)))
        text = sql.compare_series(run_ids, metric, ranks, lo, hi, n)
        return await self._answer("compare", text, _series(metric, compare=True))

    async def episodes(self, request: Request) -> Response:
        return await self._answer("episodes", sql.episodes(_required(request, "id")), _rows)

    async def events(self, request: Request) -> Response:
        return await self._answer("events", sql.events(_required(request, "id")), _rows)

    async def anomalies(self, request: Request) -> Response:
        return await self._answer("anomalies", sql.anomalies(request.query_params.get("id") or None), _rows)
