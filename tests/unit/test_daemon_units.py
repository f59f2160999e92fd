"""The daemon's pure parts: config loading, decoding, read-only SQL, result formatting, HTTP answers."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import duckdb
import httpx
import msgspec
import numpy as np
import pytest

from trainvigil.daemon.batch.decode import RawMessage, decode_batch, step_columns
from trainvigil.daemon.config import DaemonConfig, StreamConfig, load
from trainvigil.daemon.formatting import render
from trainvigil.daemon.metrics import DaemonMetrics, Histogram
from trainvigil.daemon.store.query import answer, check_read_only, open_read_only, run_query
from trainvigil.daemon.web.routes import build_app
from trainvigil.errors import ConfigError, QueryError, QueryRefusedError, WireError
from trainvigil.schemas import (
    CheckpointDigest,
    Column,
    Envelope,
    GilSample,
    Heartbeat,
    RunEnd,
    RunEvent,
    RunStart,
    Source,
    StepBatch,
    encode,
)
from trainvigil.schemas.query import QueryRequest, QueryResult, join_results, split_result

# ---- config ----------------------------------------------------------------------------------


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vigil.toml"
    path.write_text(text)
    return path


def test_config_defaults_without_file_env_or_flags() -> None:
    config = load(env={})
    assert config == DaemonConfig()
    assert config.stream == StreamConfig()
    assert config.db_path == Path("vigil-data") / "vigil.duckdb"


def test_config_precedence_defaults_then_file_then_env_then_overrides(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'data_dir = "from-file"\nhttp_port = 1111\nfetch_batch = 10\nlog_level = "debug"\n')
    env = {"VIGIL_HTTP_PORT": "2222", "VIGIL_FETCH_BATCH": "20"}
    config = load(path, overrides={"fetch_batch": 30, "query_row_limit": None}, env=env)
    assert config.data_dir == "from-file"  # file beats default
    assert config.log_level == "debug"
    assert config.http_port == 2222  # env beats file
    assert config.fetch_batch == 30  # flag beats env
    assert config.query_row_limit == DaemonConfig().query_row_limit  # a None flag is ignored
    assert config.http_host == "127.0.0.1"  # untouched default


def test_config_empty_env_value_is_ignored(tmp_path: Path) -> None:
    path = _toml(tmp_path, "http_port = 1111\n")
    assert load(path, env={"VIGIL_HTTP_PORT": ""}).http_port == 1111


def test_config_nested_stream_table_from_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[stream]\nname = "TEST"\nmax_age_s = 3600\nmax_bytes = 1024\n')
    config = load(path, env={})
    assert config.stream.name == "TEST"
    assert config.stream.max_age_s == 3600.0
    assert config.stream.max_bytes == 1024
    assert config.stream.consumer == "vigil-daemon"


def test_config_stream_keys_from_env_and_dotted_overrides(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[stream]\nname = "FILE"\nmax_age_s = 3600\n')
    env = {"VIGIL_STREAM_MAX_AGE_S": "600.5", "VIGIL_STREAM_NAME": "ENV"}
    config = load(path, overrides={"stream.name": "FLAG"}, env=env)
    assert config.stream.max_age_s == 600.5
    assert config.stream.name == "FLAG"


def test_config_unknown_top_level_key_raises_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="http_prot"):
        load(_toml(tmp_path, "http_prot = 1\n"), env={})


def test_config_unknown_stream_key_raises_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_agee"):
        load(_toml(tmp_path, "[stream]\nmax_agee = 1\n"), env={})


def test_config_unknown_override_key_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="bogus"):
        load(overrides={"bogus": 1}, env={})


def test_config_bad_type_in_file_raises_config_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="http_port"):
        load(_toml(tmp_path, 'http_port = "ninety"\n'), env={})


def test_config_bad_type_in_env_raises_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="max_age_s"):
        load(env={"VIGIL_STREAM_MAX_AGE_S": "a week"})


def test_config_bad_literal_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="log_format"):
        load(overrides={"log_format": "xml"}, env={})


def test_config_missing_file_raises_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load(missing, env={})
    assert info.value.key == "config"
    assert str(missing) in str(info.value)


def test_config_invalid_toml_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load(_toml(tmp_path, "http_port = = 3\n"), env={})
    assert info.value.key == "config"


# ---- decode ----------------------------------------------------------------------------------

SOURCE = Source(run_id="run-a", rank=1, world_size=2, host="h", pid=7)


def _steps_batch(n: int, *, loss_len: int | None = None, present: bytes = b"") -> StepBatch:
    return StepBatch(
        time=1.0,
        step=np.arange(n, dtype="<i8").tobytes(),
        times=np.full(n, 100.0, dtype="<f8").tobytes(),
        columns={
            "loss": Column(values=np.ones(n if loss_len is None else loss_len, dtype="<f8").tobytes()),
            "my_custom": Column(values=np.arange(n, dtype="<f8").tobytes(), present=present),
        },
    )


def _msg(seq: int, data: bytes, subject: str = "vigil.v1.run-a.metrics") -> RawMessage:
    return RawMessage(subject=subject, data=data, seq=seq)


def _envelope(*records: object, source: Source = SOURCE) -> bytes:
    return encode(Envelope(source=source, seq=1, records=list(records)))  # type: ignore[arg-type]


def test_decode_batch_dead_letters_bad_messages_with_distinct_reasons_and_keeps_good_ones() -> None:
    good = _envelope(_steps_batch(4), RunStart(time=0.0))
    raw = msgspec.to_builtins(Envelope(source=SOURCE, records=[RunEnd(time=0.0)]), builtin_types=(bytes,))
    raw["v"] = 2
    wrong_version = msgspec.msgpack.encode(raw)
    truncated = good[: len(good) // 2]
    short_column = _envelope(_steps_batch(4, loss_len=3))
    also_good = _envelope(Heartbeat(time=0.0, last_step=3))
    batch = decode_batch(
        [
            _msg(10, good),
            _msg(11, b"\x00garbage\xff"),
            _msg(12, wrong_version),
            _msg(13, truncated),
            _msg(14, short_column),
            _msg(15, also_good, "vigil.v1.run-a.hb"),
        ]
    )
    assert batch.messages == 6
    assert batch.max_seq == 15
    reasons = {d.seq: d.reason for d in batch.dead_letters}
    assert reasons == {11: "malformed", 12: "schema_version", 13: "malformed", 14: "invalid_batch"}
    errors = {d.seq: d.error for d in batch.dead_letters}
    assert "truncated" in errors[13].lower()
    assert errors[11] != errors[13]
    assert "version 2" in errors[12]
    for dead in batch.dead_letters:
        assert dead.error
        assert dead.subject == "vigil.v1.run-a.metrics"
    assert next(d for d in batch.dead_letters if d.seq == 12).data == wrong_version
    assert "'loss'" in next(d for d in batch.dead_letters if d.seq == 14).error
    assert batch.step_rows == 4
    assert len(batch.run_starts) == 1
    assert len(batch.heartbeats) == 1
    assert batch.events_ingested == 6


def test_decode_batch_dead_letters_a_bad_message_whole() -> None:
    """A message with a good record and a bad step batch contributes nothing."""
    data = _envelope(RunStart(time=0.0), RunEvent(time=0.0, kind="k"), _steps_batch(3, present=b"\x01"))
    batch = decode_batch([_msg(1, data)])
    assert [d.reason for d in batch.dead_letters] == ["invalid_batch"]
    assert batch.run_starts == [] and batch.events == [] and batch.steps == []
    assert batch.events_ingested == 0


def test_decode_batch_rejects_empty_run_id_as_invalid() -> None:
    batch = decode_batch([_msg(1, _envelope(RunStart(time=0.0), source=Source(run_id="")))])
    assert [d.reason for d in batch.dead_letters] == ["invalid"]


def test_decode_batch_routes_every_record_type() -> None:
    records = [
        _steps_batch(2),
        RunStart(time=0.0),
        RunEnd(time=0.0),
        RunEvent(time=0.0, kind="x"),
        Heartbeat(time=0.0),
        GilSample(
            time=0.0,
            period=1,
            samples=1,
            wait_p50=0,
            wait_p90=0,
            wait_p99=0,
            wait_max=0,
            busy_share=0,
            wait_share=0,
            held=0,
            switch_interval=0.005,
        ),
        CheckpointDigest(time=0.0, step=1, algo="a", root="r"),
    ]
    batch = decode_batch([_msg(1, _envelope(*records))])
    assert not batch.dead_letters
    assert (len(batch.steps), len(batch.run_starts), len(batch.run_ends), len(batch.events)) == (1, 1, 1, 1)
    assert (len(batch.heartbeats), len(batch.gil_samples), len(batch.checkpoints)) == (1, 1, 1)
    assert batch.run_starts[0][0] == SOURCE
    # Anomalies and canary verdicts are the daemon's own output, refused from the wire (test_record_authority).
    assert batch.events_ingested == 2 + 6


def test_step_columns_splits_known_and_custom_metrics_with_masks() -> None:
    cols = step_columns(SOURCE, _steps_batch(3, present=b"\x01\x00\x01"))
    assert len(cols) == 3
    assert cols.step.tolist() == [0, 1, 2]
    assert set(cols.known) == {"loss"} and set(cols.custom) == {"my_custom"}
    values, mask = cols.known["loss"]
    assert values.tolist() == [1.0, 1.0, 1.0] and mask is None
    values, mask = cols.custom["my_custom"]
    assert mask is not None and mask.tolist() == [True, False, True]


def test_step_columns_rejects_step_bytes_that_are_not_int64s() -> None:
    batch = StepBatch(time=0.0, step=b"\x00" * 7, times=b"")
    with pytest.raises(WireError) as info:
        step_columns(SOURCE, batch)
    assert info.value.reason == "invalid_batch"


def test_step_columns_rejects_times_of_the_wrong_length() -> None:
    batch = StepBatch(time=0.0, step=np.arange(2, dtype="<i8").tobytes(), times=b"\x00" * 8)
    with pytest.raises(WireError, match="times"):
        step_columns(SOURCE, batch)


# ---- read-only SQL ---------------------------------------------------------------------------


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect(":memory:")
    yield c
    c.close()


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM t",
        "INSERT INTO t VALUES (1)",
        "UPDATE t SET i = 1",
        "COPY t TO '/tmp/out.csv'",
        "ATTACH '/tmp/other.duckdb' AS other",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "PRAGMA enable_profiling",
        "CREATE TABLE x (i INTEGER)",
        "DROP TABLE t",
        "EXPORT DATABASE '/tmp/dump'",
        "SELECT 1; DELETE FROM t",
        "SELECT 1; SELECT 2",
        "",
        "   \n\t",
        "SELEC 1",
    ],
)
def test_check_read_only_refuses_everything_but_one_select(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    with pytest.raises(QueryRefusedError):
        check_read_only(con, sql)


def test_check_read_only_names_the_refused_statement_kind(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryRefusedError, match="DELETE"):
        check_read_only(con, "delete from t")


def test_check_read_only_refuses_multiple_statements_with_a_clear_message(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryRefusedError, match="one statement"):
        check_read_only(con, "select 1; select 2")


@pytest.mark.parametrize(
    "sql",
    ["SELECT 1", "select * from t where i > 3;", "WITH a AS (SELECT 1 AS x) SELECT x FROM a", "FROM t LIMIT 1"],
)
def test_check_read_only_accepts_select_and_with(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    check_read_only(con, sql)


@pytest.fixture
def ro_db(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    path = tmp_path / "vigil.duckdb"
    writer = duckdb.connect(str(path))
    writer.execute("CREATE TABLE t AS SELECT range AS i, 'row ' || range AS s, range * 0.5 AS f FROM range(5000)")
    writer.execute("CREATE TABLE d AS SELECT DATE '2024-01-02' AS day, 1.25::DECIMAL(5, 2) AS dec")
    writer.close()
    ro = open_read_only(str(path))
    yield ro
    ro.close()


@pytest.mark.parametrize(
    "sql",
    [
        "select * from read_csv('/etc/passwd')",
        "select * from read_text('/etc/passwd')",
        "select * from read_parquet('/etc/passwd')",
        "select * from read_csv('https://example.com/data.csv')",
        "select * from glob('/etc/*')",
    ],
)
def test_run_query_refuses_file_access_from_select(ro_db: duckdb.DuckDBPyConnection, sql: str) -> None:
    with pytest.raises(QueryRefusedError, match="disabled"):
        run_query(ro_db, sql, limit=10, timeout=10)


def test_run_query_cannot_turn_external_access_back_on(ro_db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryRefusedError):
        run_query(ro_db, "SET enable_external_access = true", limit=10, timeout=10)
    with pytest.raises(duckdb.Error):  # the configuration is locked even outside check_read_only
        ro_db.execute("SET enable_external_access = true")


def test_run_query_enforces_the_row_limit_and_flags_truncation(ro_db: duckdb.DuckDBPyConnection) -> None:
    result = run_query(ro_db, "select i, s from t order by i", limit=100, timeout=10)
    assert len(result.rows) == 100
    assert result.truncated
    assert result.columns == ["i", "s"]
    assert result.types == ["BIGINT", "VARCHAR"]
    assert result.rows[:2] == [[0, "row 0"], [1, "row 1"]]


def test_run_query_exactly_at_the_limit_is_not_truncated(ro_db: duckdb.DuckDBPyConnection) -> None:
    result = run_query(ro_db, "select i from t where i < 100", limit=100, timeout=10)
    assert len(result.rows) == 100
    assert not result.truncated


def test_run_query_makes_dates_and_decimals_plain_strings(ro_db: duckdb.DuckDBPyConnection) -> None:
    result = run_query(ro_db, "select * from d", limit=10, timeout=10)
    assert result.rows == [["2024-01-02", "1.25"]]
    msgspec.msgpack.encode(result)


def test_run_query_bad_sql_raises_query_error(ro_db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryError, match="no_such_table"):
        run_query(ro_db, "select * from no_such_table", limit=10, timeout=10)


def test_run_query_interrupts_a_query_past_its_timeout(ro_db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(QueryError, match="interrupted"):
        run_query(ro_db, "select count(*) from range(100000000) a, range(100000000) b", limit=10, timeout=0.2)


def test_answer_folds_refusals_and_errors_into_the_result(ro_db: duckdb.DuckDBPyConnection) -> None:
    refused = answer(ro_db, QueryRequest(sql="delete from t"), max_limit=10, timeout=10)
    assert refused.refused and refused.error
    failed = answer(ro_db, QueryRequest(sql="select nope from t"), max_limit=10, timeout=10)
    assert not failed.refused and failed.error
    capped = answer(ro_db, QueryRequest(sql="select * from t", limit=10_000), max_limit=7, timeout=10)
    assert len(capped.rows) == 7 and capped.truncated


def _big_result(n: int = 20_000) -> QueryResult:
    return QueryResult(
        columns=["i", "s", "f", "n"],
        types=["BIGINT", "VARCHAR", "DOUBLE", "INTEGER"],
        rows=[[i, "x" * (i % 97), i * 0.25, None] for i in range(n)],
        truncated=True,
    )


def _encoded_size(result: QueryResult) -> int:
    return len(msgspec.msgpack.encode(result))


@pytest.mark.parametrize("max_bytes", [1000, 4096, 65536])
def test_split_result_parts_join_back_to_the_original(max_bytes: int) -> None:
    result = _big_result()
    parts = split_result(result, max_bytes)
    assert len(parts) > 1
    assert [p.more for p in parts] == [True] * (len(parts) - 1) + [False]
    assert all(not p.truncated for p in parts[:-1]) and parts[-1].truncated
    assert all(p.columns == result.columns and p.types == result.types for p in parts)
    # Every part's rows fit the budget; the envelope around them adds a fixed, small overhead
    # (plus up to 4 bytes as the rows array header grows from fixarray to array32).
    overhead = _encoded_size(msgspec.structs.replace(result, rows=[], more=True)) + 4
    assert all(_encoded_size(p) <= max_bytes + overhead for p in parts)
    decoded = [msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=QueryResult) for p in parts]
    assert join_results(decoded) == result


@pytest.mark.parametrize("max_bytes", [300, 1000, 4096, 65536])
def test_split_result_every_encoded_part_stays_under_max_bytes(max_bytes: int) -> None:
    """The whole encoded part fits, columns/types/flags included, not just its rows."""
    parts = split_result(_big_result(), max_bytes)
    assert len(parts) > 1
    assert all(_encoded_size(p) <= max_bytes for p in parts)


def test_split_result_of_a_small_or_empty_result_is_one_part() -> None:
    small = QueryResult(columns=["a"], types=["INTEGER"], rows=[[1]])
    assert split_result(small, 1 << 20) == [small]
    empty = QueryResult(error="refused", refused=True)
    assert split_result(empty, 100) == [empty]
    assert join_results([empty]) == empty


def test_split_result_never_splits_a_row_larger_than_the_limit() -> None:
    result = QueryResult(columns=["s"], types=["VARCHAR"], rows=[["a"], ["b" * 5000], ["c"]])
    parts = split_result(result, 1000)
    assert [p.rows for p in parts] == [[["a"]], [["b" * 5000]], [["c"]]]
    assert join_results(parts) == result


# ---- formatting ------------------------------------------------------------------------------

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


# ---- HTTP and metrics ------------------------------------------------------------------------


def _request(metrics: DaemonMetrics, path: str, method: str = "GET") -> httpx.Response:
    """One request to the daemon's real ASGI app, in process."""

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app=build_app(metrics))
        async with httpx.AsyncClient(transport=transport, base_url="http://vigil") as client:
            return await client.request(method, path)

    return anyio.run(ask, backend="asyncio")


def test_metrics_endpoint_serves_prometheus_text() -> None:
    metrics = DaemonMetrics()
    metrics.events_ingested["steps"] += 40
    metrics.events_ingested["heartbeat"] += 2
    metrics.dead_letters["malformed"] += 3
    metrics.consumer_lag = 17
    metrics.last_commit = 1795000000.25
    metrics.batch_write_seconds.observe(0.003)
    response = _request(metrics, "/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.text
    assert 'vigil_events_ingested_total{kind="steps"} 40' in text
    assert 'vigil_events_ingested_total{kind="heartbeat"} 2' in text
    assert "vigil_consumer_lag 17" in text
    assert "vigil_last_commit_timestamp_seconds 1.79500000025e+09" in text  # prometheus_client writes Go's floats
    assert 'vigil_dead_letters_total{reason="malformed"} 3' in text
    assert 'vigil_batch_write_seconds_bucket{le="0.0025"} 0' in text
    assert 'vigil_batch_write_seconds_bucket{le="0.005"} 1' in text
    assert 'vigil_batch_write_seconds_bucket{le="+Inf"} 1' in text
    assert "# TYPE vigil_batch_write_seconds histogram" in text
    assert text.endswith("\n")


def test_metrics_of_a_fresh_daemon_still_expose_every_family() -> None:
    text = DaemonMetrics().render()
    for name in (
        'vigil_events_ingested_total{kind="steps"} 0',
        'vigil_dead_letters_total{reason="malformed"} 0',
        "vigil_consumer_lag 0",
        "vigil_broker_connected 0",
        'vigil_batch_write_seconds_bucket{le="+Inf"} 0',
        "vigil_batch_write_seconds_count 0",
    ):
        assert name in text


def test_metrics_lines_are_valid_prometheus_samples() -> None:
    metrics = DaemonMetrics(broker_connected=True)
    metrics.anomalies["non_finite", "page", "open"] += 1
    metrics.webhook["sent"] += 1
    metrics.queries["ok"] += 2
    for line in metrics.render().splitlines():
        if line.startswith("#"):
            assert line.split()[1] in {"HELP", "TYPE"}
            continue
        name, value = line.rsplit(" ", 1)
        assert name.startswith("vigil_")
        float(value)


def test_histogram_buckets_are_cumulative_and_count_values_past_the_last_bound() -> None:
    hist = Histogram()
    for value in (0.0005, 0.001, 0.02, 0.02, 20.0):
        hist.observe(value)
    buckets = dict(hist.cumulative())
    assert buckets["0.001"] == 2
    assert buckets["0.025"] == 4
    assert buckets["10.0"] == 4
    assert buckets["+Inf"] == 5
    assert hist.n == 5
    assert hist.total == pytest.approx(20.0415)


def test_healthz_is_200_when_the_broker_is_connected() -> None:
    metrics = DaemonMetrics(broker_connected=True, last_seq=42, consumer_lag=3)
    response = _request(metrics, "/healthz")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    assert response.json() == {"status": "ok", "broker_connected": True, "last_seq": 42, "consumer_lag": 3}


def test_healthz_is_503_when_the_broker_is_disconnected() -> None:
    response = _request(DaemonMetrics(), "/healthz?verbose=1")
    assert response.status_code == 503
    assert response.json()["status"] == "degraded"


def test_unknown_path_is_404() -> None:
    response = _request(DaemonMetrics(), "/favicon.ico")
    assert response.status_code == 404
    assert "/healthz" in response.text


@pytest.mark.parametrize(("method", "path"), [("POST", "/metrics"), ("DELETE", "/healthz")])
def test_other_methods_are_405(method: str, path: str) -> None:
    assert _request(DaemonMetrics(), path, method).status_code == 405


def test_head_request_gets_the_get_headers_without_a_body() -> None:
    metrics = DaemonMetrics()
    head = _request(metrics, "/metrics", "HEAD")
    assert head.status_code == 200 and head.content == b""
    get = _request(metrics, "/metrics")
    assert int(head.headers["Content-Length"]) == len(get.content)
