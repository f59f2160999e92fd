"""The in-memory DuckDB the CLI computes in over what came off the bus: no files, no network, locked.

Shards' answers are merged, plans parsed and Arrow types looked up in a local DuckDB. Whatever
answered on the bus chose that data, so the connection gets what the daemon's read-only queries
get (:data:`~trainvigil.daemon.store.query.READ_ONLY_CONFIG`): ``enable_external_access = false``
(no ``read_text``, ``COPY ... TO``, ``ATTACH``, ``INSTALL``), then ``lock_configuration = true``, so
no statement can ``SET`` it back.
"""

from __future__ import annotations

import duckdb

from trainvigil.daemon.store.query import READ_ONLY_CONFIG


def sandboxed() -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB that cannot reach files or the network, nor change its configuration."""
    return duckdb.connect(":memory:", config=READ_ONLY_CONFIG)
