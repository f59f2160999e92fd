"""The DuckDB settings of every read-only DuckDB, and the locked in-memory one computed in over what came off the bus.

Shards' answers are merged, query plans parsed and Arrow types looked up in a local DuckDB.
Whatever answered on the bus chose that data, so that connection gets what the daemon's read-only
queries get (:data:`READ_ONLY_CONFIG`): ``enable_external_access = false`` (no ``read_text``,
``COPY ... TO``, ``ATTACH``, ``INSTALL``), then ``lock_configuration = true``, so no statement can
``SET`` it back.
"""

from __future__ import annotations

import duckdb

READ_ONLY_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False,
    "lock_configuration": True,
}
"""No files, no network, and no statement that could change that (the history file read-only, the sandbox)."""


def sandboxed() -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB that cannot reach files or the network, nor change its configuration."""
    return duckdb.connect(":memory:", config=READ_ONLY_CONFIG)
