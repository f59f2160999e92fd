"""Read-only queries on the daemon's own database, within ``vigil sql``'s budgets.

The query responder (``vigil sql`` over NATS) and the web view both read through here, so
there is one way to run SQL against the live file: :func:`~.query.answer` on a fresh cursor, in a
worker thread, in a transaction that is rolled back.
"""

from __future__ import annotations

import anyio
import duckdb

from trainvigil.daemon.config import DaemonConfig
from trainvigil.daemon.store.query import answer
from trainvigil.daemon.store.writer import Store
from trainvigil.errors import StoreUnavailableError
from trainvigil.schemas.query import QueryRequest, QueryResult


class ReadOnlyQueries:
    """Answers :class:`QueryRequest`s from ``store`` with the daemon's limits (``query_*`` settings)."""

    def __init__(self, store: Store, config: DaemonConfig) -> None:
        self.store = store
        self.config = config
        self._running: set[duckdb.DuckDBPyConnection] = set()

    async def answer(self, request: QueryRequest) -> QueryResult:
        """The answer to ``request``; its limit, bytes and timeout are lowered to the daemon's."""
        return await anyio.to_thread.run_sync(self._answer, request)

    def _answer(self, request: QueryRequest) -> QueryResult:
        """Run ``request`` on a fresh cursor; once more if DuckDB had invalidated the database (it is
        opened again for the second try), so a failed write's checkpoint costs readers nothing."""
        cfg = self.config
        for _ in range(2):
            try:
                cursor = self.store.cursor()
            except StoreUnavailableError as exc:
                return QueryResult(error=f"the daemon cannot read its database now: {exc}")
            self._running.add(cursor)
            try:
                result = answer(
                    cursor,
                    request,
                    cfg.query_row_limit,
                    cfg.query_timeout_s,
                    max_bytes=cfg.query_max_bytes,
                    memory_bytes=cfg.query_memory_bytes,
                    spill_bytes=cfg.query_spill_bytes,
                )
            finally:
                self._running.discard(cursor)
                cursor.close()
            if not self.store.invalidated_by(result.error):
                break
        return result

    def interrupt(self) -> None:
        """Interrupt every query running now (shutdown does not wait for them)."""
        for cursor in list(self._running):
            cursor.interrupt()
