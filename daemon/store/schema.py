"""The history file's schema: creating a file, migrating an older one, and ``schema.sql`` on every open."""

from __future__ import annotations

import contextlib
from importlib import resources
from pathlib import Path

import duckdb
import structlog

from trainvigil.errors import ConfigError

log = structlog.get_logger("trainvigil.store")

SCHEMA_VERSION = 4
"""1: times as naive UTC ``TIMESTAMP``. 2: times as ``TIMESTAMPTZ``, comments on every table and
column, the ``run_summary`` and ``open_alerts`` views. 3: ``canary_results`` gains the verdict and
its evidence (``_CANARY_V3``). 4: ``optim_results``, rows materialised from ``optim_result`` events
(a new table, which ``schema.sql`` creates in an older file too). :func:`migrate` brings older files up to date."""
STORAGE_VERSION = "v1.4.0"
"""DuckDB storage format of new files: DuckDB 1.4.0 and newer read it (the 1.4 LTS and 1.5 CLIs
among them), while the default of the DuckDB we run (2.0) is unreadable for every 1.x release."""
SCHEMA_SQL = (resources.files(__package__) / "schema.sql").read_text(encoding="utf-8")
"""Tables, comments and views; idempotent, run on every open."""
TABLES = (
    "schema_info",
    "runs",
    "steps",
    "events",
    "heartbeats",
    "gil_samples",
    "checkpoints",
    "anomalies",
    "canary_results",
    "optim_results",
    "dead_letters",
    "data_loss",
    "ingest_offsets",
)
_CANARY_V3 = (
    ("workload", "VARCHAR"),
    ("verdict", "VARCHAR"),
    ("fired_detector", "VARCHAR"),
    ("latency_s", "DOUBLE"),
    ("exit_code", "INTEGER"),
    ("duration_s", "DOUBLE"),
)
"""Columns schema version 3 appends to ``canary_results`` (as ``schema.sql`` creates them in a new file)."""


def create(path: Path) -> None:
    """An empty database file in ``STORAGE_VERSION``; DuckDB keeps a file's format as it writes on.

    Made through ``ATTACH ... (STORAGE_VERSION)``, not the ``storage_compatibility_version``
    setting of the daemon's connection: that setting also limits what the connection serializes,
    and the SQL sandbox must serialize every statement it judges (a write hidden in a CTE included).
    """
    with duckdb.connect() as con:
        con.execute("ATTACH '{}' AS fresh (STORAGE_VERSION '{}')".format(str(path).replace("'", "''"), STORAGE_VERSION))


def set_up(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Migrate the file at ``path`` (open on ``con``), apply ``SCHEMA_SQL`` and record the version of a new file.

    Raises:
        ConfigError: the file was written by a newer trainvigil.
    """
    migrate(con, path)
    con.execute(SCHEMA_SQL)
    if not con.execute("SELECT count(*) FROM schema_info").fetchall()[0][0]:
        con.execute("INSERT INTO schema_info VALUES (?)", [SCHEMA_VERSION])


def migrate(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Bring a file written by an older trainvigil up to ``SCHEMA_VERSION``, in one transaction.

    Runs before ``SCHEMA_SQL``; a new file (no ``schema_info``) has nothing to migrate. The storage
    format of an existing file stays what it was (docs/operations/upgrades.md says how to rewrite it for older CLIs).

    Raises:
        ConfigError: the file was written by a newer trainvigil.
    """
    known = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name = 'schema_info'"
    ).fetchall()[0][0]
    if not known:
        return
    version = con.execute("SELECT max(version) FROM schema_info").fetchall()[0][0] or 1
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"data_dir: {path} holds schema version {version}, newer than this trainvigil's {SCHEMA_VERSION}; "
            "upgrade trainvigil or pass another --data-dir",
            key="data_dir",
        )
    if version == SCHEMA_VERSION:
        return
    con.execute("BEGIN TRANSACTION")
    try:
        if version < 2:
            # Version 1 stored naive UTC times; as TIMESTAMPTZ they are the same instants.
            naive = con.execute(
                "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = current_database() "
                "AND schema_name = 'main' AND list_contains(?, table_name) AND data_type = 'TIMESTAMP'",
                [list(TABLES)],
            ).fetchall()
            for table, column in naive:
                con.execute(
                    f'ALTER TABLE "{table}" ALTER COLUMN "{column}" TYPE TIMESTAMPTZ '
                    f"USING timezone('UTC', \"{column}\")"
                )
        if version < 3:
            for column, kind in _CANARY_V3:
                con.execute(f"ALTER TABLE canary_results ADD COLUMN IF NOT EXISTS {column} {kind}")
            # Rows of the old schema only knew ``passed``.
            con.execute("UPDATE canary_results SET verdict = CASE WHEN passed THEN 'pass' ELSE 'fail' END")
        # Version 4 only adds optim_results, which SCHEMA_SQL creates; before it no event made a row.
        con.execute("UPDATE schema_info SET version = ?", [SCHEMA_VERSION])
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    log.info("store_migrated", path=str(path), from_version=version, to_version=SCHEMA_VERSION)
