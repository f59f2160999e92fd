"""The JSON data endpoints of the web view: every answer is a read-only query through the daemon's query path.

``Ask`` is the one way in: the daemon hands the web view its read-only query runner (the one
``vigil sql`` uses, with its limits), so the web has no database handle of its own. At most
``concurrency`` web queries run at once; the rest wait their turn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse as _StarletteJSON

from trainvigil.daemon.web import sql
from trainvigil.daemon.web.cache import SharedAnswers
from trainvigil.schemas import KNOWN_METRICS
from trainvigil.schemas.query import QueryRequest, QueryResult

Ask = Callable[[QueryRequest], Awaitable[QueryResult]]
MAX_COMPARE = 10


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


def _required(request: Request, name: str) -> str:
    value = request.query_params.get(name, "")
    if not value:
        raise BadRequestError(f"the {name} parameter is required")
    return value


class DataApi:
    """The handlers of ``/api/*``."""

    def __init__(self, ask: Ask, concurrency: int = 2, generation: Callable[[], int] = lambda: 0) -> None:
        """``generation``: the count of commits so far (:attr:`.live.Broadcaster.generation`); a query
        runs once per distinct text and generation, its answer shared by every request that asks it."""
        self._ask = ask
        self._slots = anyio.CapacityLimiter(concurrency)
        self._shared: SharedAnswers[QueryResult] = SharedAnswers(generation)

    async def query(self, text: str, limit: int = sql.MAX_ROWS) -> QueryResult:
        return await self._shared.get((text, limit), lambda: self._run(text, limit))

    async def _run(self, text: str, limit: int) -> QueryResult:
        async with self._slots:
            return await self._ask(QueryRequest(sql=text, limit=limit))

    async def _answer(self, text: str, limit: int = sql.MAX_ROWS) -> JSONResponse:
        result = await self.query(text, limit)
        if result.error:
            return JSONResponse({"error": result.error}, status_code=400 if result.refused else 503)
        return JSONResponse({"rows": _records(result), "truncated": result.truncated})

    async def runs(self, request: Request) -> JSONResponse:
        return await self._answer(sql.runs())

    async def run(self, request: Request) -> JSONResponse:
        run_id = _required(request, "id")
        result = await self.query(sql.run_info(run_id))
        if result.error:
            return JSONResponse({"error": result.error}, status_code=503)
        if not result.rows:
            return JSONResponse({"error": f"no run {run_id!r}"}, status_code=404)
        info = _records(result)[0]
        info["metrics"] = [m for m in KNOWN_METRICS if info.pop(m)] + list(info.pop("custom") or [])
        return JSONResponse(info)

    async def series(self, request: Request) -> JSONResponse:
        run_id, metric = _required(request, "id"), _required(request, "metric")
        ranks = [int(r) for r in request.query_params.get("ranks", "").split(",") if r.strip().isdigit()]
        lo, hi = _int(request, "lo"), _int(request, "hi")
        n = sql.bucket_count(len(ranks) or _int(request, "nranks") or 1)
        return await self._series(sql.run_series(run_id, metric, ranks, lo, hi, n), metric)

    async def compare(self, request: Request) -> JSONResponse:
        run_ids = [r for r in request.query_params.getlist("id") if r][:MAX_COMPARE]
        if not run_ids:
            raise BadRequestError("name at least one run: ?id=A&id=B (up to 10)")
        metric = _required(request, "metric")
        lo, hi = _int(request, "lo"), _int(request, "hi")
        n = sql.bucket_count(len(run_ids))
        return await self._series(sql.compare_series(run_ids, metric, lo, hi, n), metric)

    async def _series(self, text: str, metric: str) -> JSONResponse:
        result = await self.query(text)
        if result.error:
            return JSONResponse({"error": result.error}, status_code=400 if result.refused else 503)
        return JSONResponse({"metric": metric, "series": sql.points(result.rows), "truncated": result.truncated})

    async def episodes(self, request: Request) -> JSONResponse:
        return await self._answer(sql.episodes(_required(request, "id")))

    async def events(self, request: Request) -> JSONResponse:
        return await self._answer(sql.events(_required(request, "id")))

    async def anomalies(self, request: Request) -> JSONResponse:
        return await self._answer(sql.anomalies(request.query_params.get("id") or None))
