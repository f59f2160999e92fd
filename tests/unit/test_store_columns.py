"""Every wire record maps onto its table by column name (``daemon/store/_arrow.py``), and the Arrow
tables are built without DuckDB.

A field added to a record struct but not to ``schema.sql`` (or a column added to ``schema.sql`` that
no record fills) fails here, naming both.
"""

from __future__ import annotations

from datetime import UTC, datetime

import duckdb
import msgspec
import pyarrow as pa
import pytest

from trainvigil.daemon.store import _arrow
from trainvigil.daemon.store._optim import COLUMNS as OPTIM_COLUMNS
from trainvigil.daemon.store.schema import SCHEMA_SQL
from trainvigil.schemas import Anomaly, CanaryResult, Heartbeat, RunEnd, RunEvent, RunStart, Source
from trainvigil.schemas.kinds import RECORD_KINDS
from trainvigil.schemas.records import StepBatch

T = 1_700_000_000.0


@pytest.fixture(scope="module")
def tables() -> dict[str, list[str]]:
    """Each table of ``schema.sql`` and its columns, in order."""
    with duckdb.connect() as con:
        con.execute(SCHEMA_SQL)
        rows = con.execute(
            "SELECT table_name, list(column_name ORDER BY column_index) FROM duckdb_columns()"
            " WHERE schema_name = 'main' AND NOT internal GROUP BY table_name"
        ).fetchall()
    return dict(rows)


@pytest.mark.parametrize("rows", _arrow.RECORDS, ids=lambda r: r.table)
def test_every_field_of_a_wire_record_is_a_column_of_its_table(rows: _arrow.Rows, tables: dict[str, list[str]]) -> None:
    columns = tables[rows.table]
    missing = [f for f in rows.columns if f not in columns]
    assert not missing, f"{rows.record.__name__} fields {missing} have no column in table {rows.table} (schema.sql)"
    unfilled = [c for c in columns if c not in rows.columns]
    assert not unfilled, f"columns {unfilled} of table {rows.table} (schema.sql) are no field of {rows.record.__name__}"
    assert set(rows.source) <= set(Source.__struct_fields__)
    assert rows.unstored <= set(rows.record.__struct_fields__), "only fields of the record are left out"


@pytest.mark.parametrize("record", [RunStart, RunEnd], ids=lambda r: r.__name__)
def test_every_field_of_a_record_stored_as_an_event_is_accounted_for(record: type[msgspec.Struct]) -> None:
    assert sorted(_arrow.FOLDED[record]) == sorted(record.__struct_fields__), (
        f"{record.__name__}'s fields and what daemon/store/_arrow.py stores of it (FOLDED) differ"
    )


def test_every_record_kind_of_the_wire_has_its_table() -> None:
    """A new record kind needs its row mapping (or its place among the kinds stored another way)."""
    mapped = {r.record for r in _arrow.RECORDS} | set(_arrow.FOLDED) | {StepBatch}
    unmapped = [k.__name__ for k in RECORD_KINDS if k not in mapped]
    assert not unmapped, f"record kinds {unmapped} have no table in daemon/store/_arrow.py"


def test_optim_results_columns_are_the_tables(tables: dict[str, list[str]]) -> None:
    assert list(OPTIM_COLUMNS) == tables["optim_results"]


def test_step_columns_are_the_steps_table(tables: dict[str, list[str]]) -> None:
    assert tables["steps"] == _arrow.STEP_COLUMNS


def test_a_record_becomes_named_columns_with_json_text_and_instants() -> None:
    source = Source(run_id="r", rank=3, host="h", pid=7)
    beat = Heartbeat(time=T, last_step=5, dropped={"full": 2})
    columns = _arrow.HEARTBEATS([(source, beat)])
    assert columns["run_id"] == ["r"] and columns["rank"] == [3] and columns["pid"] == [7]
    assert columns["dropped"] == ['{"full":2}']
    assert columns["time"] == [datetime.fromtimestamp(T, tz=UTC)]
    assert "stack" not in columns


def test_run_starts_and_ends_are_event_rows_after_the_events() -> None:
    src = Source(run_id="r")
    columns = _arrow.event_columns(
        [(src, RunEvent(time=T, kind="k", step=1))],
        [(src, RunStart(time=T, argv=["a"]))],
        [(src, RunEnd(time=T + 1, status="error", error="boom", last_step=9))],
    )
    assert columns["kind"] == ["k", "run_start", "run_end"]
    assert columns["step"] == [1, None, 9]
    assert msgspec.json.decode(columns["fields"][2]) == {"status": "error", "dropped": {}, "error": "boom"}


def test_an_alert_row_keeps_the_time_its_episode_opened() -> None:
    update = Anomaly(
        time=T + 60, run_id="r", rank=0, step=4, detector="d", severity="page", episode="e", state="cleared"
    )
    opened = datetime.fromtimestamp(T, tz=UTC)
    columns = _arrow.anomaly_columns([update], [opened])
    assert columns["time"] == [opened]
    assert columns["updated_at"] == [datetime.fromtimestamp(T + 60, tz=UTC)]


def test_a_canary_result_without_a_verdict_gets_one_from_passed() -> None:
    result = CanaryResult(time=T, name="canary-1", fault="nan", passed=False)
    assert _arrow.canary_columns([result])["verdict"] == ["fail"]


def test_a_value_that_does_not_fit_its_column_raises_while_building() -> None:
    schema = pa.schema([("rank", pa.int32()), ("run_id", pa.string())])
    assert _arrow.table({"run_id": ["r"], "rank": [1]}, schema).column_names == ["run_id", "rank"]
    with pytest.raises((OverflowError, pa.ArrowInvalid)):
        _arrow.table({"rank": [2**40]}, schema)
