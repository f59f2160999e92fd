"""Query results as text (``daemon/formatting.py``): an aligned table, CSV, and strict JSON lines."""

from __future__ import annotations

import csv
import io
import json

import msgspec

from trainvigil.daemon.formatting import render
from trainvigil.schemas.query import QueryResult

RESULT = QueryResult(
    columns=["run_id", "step", "loss"],
    types=["VARCHAR", "BIGINT", "DOUBLE"],
    rows=[["run-a", 1, 0.123456789], ["run-b", 20, None]],
)


def test_render_table_aligns_columns_and_counts_rows() -> None:
    text = render(RESULT, "table")
    lines = text.splitlines()
    assert lines[0] == "+--------+------+----------+"
    assert lines[1] == "| run_id | step | loss     |"
    assert lines[3] == "| run-a  | 1    | 0.123457 |"
    assert lines[4] == "| run-b  | 20   | NULL     |"
    assert lines[5] == lines[0] == lines[2]
    assert lines[-1] == "2 rows"
    assert len({len(line) for line in lines[:-1]}) == 1


def test_render_table_footer_says_when_the_row_limit_cut_the_answer() -> None:
    text = render(msgspec.structs.replace(RESULT, rows=RESULT.rows[:1], truncated=True), "table")
    assert text.splitlines()[-1].startswith("1 row (row limit reached")


def test_render_table_of_no_rows() -> None:
    text = render(msgspec.structs.replace(RESULT, rows=[]), "table")
    assert text.splitlines()[-1] == "0 rows"
    assert "| run_id | step | loss |" in text


def test_render_csv_has_header_and_rows() -> None:
    text = render(RESULT, "csv")
    assert list(csv.reader(io.StringIO(text))) == [
        ["run_id", "step", "loss"],
        ["run-a", "1", "0.123456789"],
        ["run-b", "20", ""],
    ]


def test_render_json_is_one_object_per_line() -> None:
    text = render(RESULT, "json")
    assert [json.loads(line) for line in text.splitlines()] == [
        {"run_id": "run-a", "step": 1, "loss": 0.123456789},
        {"run_id": "run-b", "step": 20, "loss": None},
    ]


def _strict_json(line: str) -> object:
    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_render_json_output_is_strict_json_even_for_nan_and_inf() -> None:
    result = QueryResult(columns=["loss"], types=["DOUBLE"], rows=[[float("nan")], [float("inf")]])
    for line in render(result, "json").splitlines():
        _strict_json(line)
