"""The web view's read queries, as SQL text (pure: built and tested without a database).

They run through the daemon's read-only query path like any ``vigil sql`` query, so values from a
request only ever enter as quoted literals (:func:`literal`) or checked integers, and known metric
names as identifiers from a fixed list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from trainvigil.daemon.config import QUERY_ROW_LIMIT
from trainvigil.schemas import KNOWN_METRICS

MAX_POINTS = 2000
"""Points per series at most: every bucket contributes its minimum and its maximum."""
MAX_ROWS = QUERY_ROW_LIMIT
"""Rows one answer of the web view may hold (``query_row_limit``'s default)."""
_CHRONO = "coalesce(updated_at, time)"
_steps = msgspec.json.Decoder(list[int]).decode
_values = msgspec.json.Decoder(list[float]).decode
_kinds = msgspec.json.Decoder(list[str]).decode


def literal(text: str) -> str:
    """``text`` as a SQL string literal (DuckDB's standard strings: only ``'`` needs doubling)."""
    return "'" + text.replace("'", "''") + "'"


def metric_expr(metric: str) -> str:
    """The column of a known metric, else the custom metric's value in ``extra``."""
    return metric if metric in KNOWN_METRICS else f"extra[{literal(metric)}]"


def runs() -> str:
    """Every run with its status, ranks, last step, recent steps/s and open alerts by severity, latest first."""
    return f"""
WITH last AS (SELECT run_id, max(step) AS last_step, count(DISTINCT rank) AS ranks FROM steps GROUP BY run_id),
recent AS (
    SELECT s.run_id,
        (max(s.step) - min(s.step)) / nullif(epoch(max(s.time)) - epoch(min(s.time)), 0) AS steps_per_s
    FROM steps s JOIN runs r USING (run_id)
    WHERE s.time >= r.last_seen - INTERVAL 30 SECOND GROUP BY s.run_id
),
episodes AS (
    SELECT run_id, episode, bool_or(severity = 'page') AS paged, arg_max(state, {_CHRONO}) AS state
    FROM anomalies GROUP BY run_id, episode
),
open AS (
    SELECT run_id, count_if(paged) AS page, count_if(NOT paged) AS warn
    FROM episodes WHERE state <> 'cleared' GROUP BY run_id
)
SELECT r.run_id, r.status, greatest(r.world_size, last.ranks) AS ranks, last.last_step, recent.steps_per_s,
    epoch(r.last_seen) AS last_seen, epoch(r.first_seen) AS first_seen,
    coalesce(open.page, 0) AS open_page, coalesce(open.warn, 0) AS open_warn
FROM runs r LEFT JOIN last USING (run_id) LEFT JOIN recent USING (run_id) LEFT JOIN open USING (run_id)
ORDER BY r.last_seen DESC NULLS LAST, r.run_id"""


def run_info(run_id: str) -> str:
    """One run's row, its step range, ranks, which metrics it logged (known ones with values, custom names), and
    the drop-ins' ``names=`` mapping it announced (``compat_names``: JSON text, or NULL)."""
    counts = ", ".join(f"count({m}) AS {m}" for m in KNOWN_METRICS)
    run = literal(run_id)
    return f"""
SELECT r.status, r.world_size, epoch(r.first_seen) AS first_seen, epoch(r.last_seen) AS last_seen,
    s.first_step, s.last_step, s.ranks, {", ".join(f"s.{m}" for m in KNOWN_METRICS)},
    (SELECT list(DISTINCT k ORDER BY k) FROM (SELECT unnest(map_keys(extra)) AS k FROM steps WHERE run_id = {run}))
        AS custom,
    (SELECT fields->>'$.names' FROM events WHERE run_id = {run} AND kind = 'compat_names' ORDER BY time DESC LIMIT 1)
        AS compat_names
FROM runs r, (
    SELECT min(step) AS first_step, max(step) AS last_step, list(DISTINCT rank ORDER BY rank) AS ranks, {counts}
    FROM steps WHERE run_id = {run}
) s
WHERE r.run_id = {run}"""


def _bucketed(where: str, key: str, metrics: Sequence[str], lo: int | None, hi: int | None, n: int) -> str:
    """Min/max buckets of each of ``metrics`` over steps ``lo..hi`` (all when ``None``), a series per metric
    and ``key`` expression: one row per series, ``metric, key, x, y, t, nx, nv, nt`` (see :func:`buckets`).

    Several metrics are read in one scan of the run's rows (their values unnested side by side), and
    each metric's buckets span the steps where it has values, finite or not."""
    bounds = "".join(f" AND step {op} {int(v)}" for op, v in ((">=", lo), ("<=", hi)) if v is not None)
    if len(metrics) == 1:
        values = f"{literal(metrics[0])} AS metric, {metric_expr(metrics[0])} AS v"
    else:
        names = ", ".join(literal(m) for m in metrics)
        values = f"unnest([{names}]) AS metric, unnest([{', '.join(metric_expr(m) for m in metrics)}]) AS v"
    order = "ORDER BY bucket, s, v, t"  # the same total order in all three lists
    finite = "FILTER (WHERE isfinite(a.v))"
    # NaN and ±Inf have no place on a y axis and no JSON number: each bucket gives the first step of each
    # kind it holds, named, so a chart marks where a metric went non-finite (however long it stays so).
    # Found in the same pass as the buckets' extremes: a second scan of a long run costs as much again.
    kinds = (("nan", "isnan(a.v)"), ("+inf", "a.v = 'inf'::DOUBLE"), ("-inf", "a.v = '-inf'::DOUBLE"))
    firsts = "".join(
        f",\n        min(a.step) FILTER (WHERE {test}) AS s_{i}, arg_min(a.t, a.step) FILTER (WHERE {test}) AS t_{i}"
        for i, (_, test) in enumerate(kinds)
    )
    odd = "\n    UNION ALL\n".join(
        f"    SELECT metric, key, s_{i} AS s, {literal(kind)} AS kind, t_{i} AS t FROM b WHERE s_{i} IS NOT NULL"
        for i, (kind, _) in enumerate(kinds)
    )
    return f"""
WITH f AS (
    SELECT metric, key, step, epoch(time) AS t, v FROM (SELECT {key} AS key, step, time, {values}
        FROM steps WHERE {where}{bounds}) WHERE v IS NOT NULL
), r AS (SELECT metric, min(step) AS lo, max(step) AS hi FROM f GROUP BY metric),
b AS (
    SELECT a.metric, a.key, floor((a.step - r.lo) * {int(n)}.0 / (r.hi - r.lo + 1))::BIGINT AS bucket,
        arg_min(a.step, a.v) {finite} AS s_min, min(a.v) {finite} AS v_min,
        arg_max(a.step, a.v) {finite} AS s_max, max(a.v) {finite} AS v_max,
        arg_min(a.t, a.v) {finite} AS t_min, arg_max(a.t, a.v) {finite} AS t_max{firsts}
    FROM f AS a JOIN r USING (metric) GROUP BY ALL
), p AS (
    SELECT metric, key, bucket, s_min AS s, v_min AS v, t_min AS t FROM b WHERE s_min IS NOT NULL
    UNION ALL
    SELECT metric, key, bucket, s_max, v_max, t_max FROM b
    WHERE s_max <> s_min OR v_max <> v_min OR t_max IS DISTINCT FROM t_min
), finite AS (
    SELECT metric, key, to_json(list(s {order}))::VARCHAR AS x, to_json(list(v {order}))::VARCHAR AS y,
        to_json(list(t {order}))::VARCHAR AS t
    FROM p GROUP BY metric, key
), odd AS (
{odd}
), nonfinite AS (
    SELECT metric, key, to_json(list(s ORDER BY s, kind))::VARCHAR AS nx,
        to_json(list(kind ORDER BY s, kind))::VARCHAR AS nv, to_json(list(t ORDER BY s, kind))::VARCHAR AS nt
    FROM odd GROUP BY metric, key
)
SELECT metric, key, coalesce(x, '[]') AS x, coalesce(y, '[]') AS y, coalesce(t, '[]') AS t, nx, nv, nt
FROM finite FULL OUTER JOIN nonfinite USING (metric, key) ORDER BY metric, key"""


def buckets(where: str, key: str, metric: str, lo: int | None, hi: int | None, n: int) -> str:
    """Min/max buckets of ``metric`` over steps ``lo..hi`` (all when ``None``), one series per ``key`` expression.

    ``n`` buckets span the steps present in the range, so a zoomed-in range gets the same number of
    points, finer. Each bucket gives its minimum and its maximum in step order (one point when they
    are the same step). The answer is one row per key, ``key, x, y, t``: the points' steps, values and
    wall times (Unix seconds) as JSON arrays written by DuckDB. One row per series, not one per bucket,
    because the query path turns every value of a row into a Python object under the GIL the ingest
    needs; a few strings cost nothing there, and :func:`points` decodes them in C.
    """
    return f"SELECT key, x, y, t, nx, nv, nt FROM ({_bucketed(where, key, [metric], lo, hi, n)}) ORDER BY key"


def _series(x: str, y: str, t: str, nx: str | None, nv: str | None, nt: str | None) -> dict[str, Any]:
    series: dict[str, Any] = {"x": _steps(x), "y": _values(y), "t": _values(t)}
    if nx is not None:  # only a series with NaN or ±Inf values has them, as steps, kinds and times
        series["nonfinite"] = {"x": _steps(nx), "v": _kinds(nv or "[]"), "t": _values(nt or "[]")}
    return series


def points(rows: Sequence[Sequence[Any]]) -> dict[str, dict[str, Any]]:
    """:func:`buckets` rows as one step-ordered series per key: ``{key: {"x": steps, "y": values, "t": times}}``,
    the finite values; a series with NaN or ±Inf values also has ``"nonfinite": {"x": steps, "v": kinds,
    "t": times}``, a kind being ``"nan"``, ``"+inf"`` or ``"-inf"`` (JSON has no number for them)."""
    return {str(key): _series(*series) for key, *series in rows}


def points_by_metric(rows: Sequence[Sequence[Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """:func:`run_series_of` rows as ``{metric: {key: points}}`` (see :func:`points`)."""
    by_metric: dict[str, list[Sequence[Any]]] = {}
    for metric, *series in rows:
        by_metric.setdefault(str(metric), []).append(series)
    return {metric: points(series) for metric, series in by_metric.items()}


def bucket_count(series: int) -> int:
    """Buckets per series so ``series`` of them fit :data:`MAX_ROWS` rows and :data:`MAX_POINTS` points each."""
    return max(10, min(MAX_POINTS // 2, MAX_ROWS // max(1, series)))


def _run_ranks(run_id: str, ranks: Sequence[int]) -> str:
    where = f"run_id = {literal(run_id)}"
    if ranks:
        where += f" AND rank IN ({', '.join(str(int(r)) for r in ranks)})"
    return where


def run_series(run_id: str, metric: str, ranks: Sequence[int], lo: int | None, hi: int | None, n: int) -> str:
    """One run's ``metric``, a series per rank (``ranks`` empty: every rank)."""
    return buckets(_run_ranks(run_id, ranks), "rank", metric, lo, hi, n)


def run_series_of(
    run_id: str, metrics: Sequence[str], ranks: Sequence[int], lo: int | None, hi: int | None, n: int
) -> str:
    """One run's ``metrics`` in one query, a series per metric and rank: rows ``metric, key, x, y, t``."""
    return _bucketed(_run_ranks(run_id, ranks), "rank", metrics, lo, hi, n)


def compare_series(
    run_ids: Sequence[str], metric: str, ranks: Sequence[int], lo: int | None, hi: int | None, n: int
) -> str:
    """``metric`` of several runs, a series per run and rank keyed ``<rank>:<run id>`` (``ranks`` empty: every rank)."""
    where = f"run_id IN ({', '.join(literal(r) for r in run_ids)})"
    if ranks:
        where += f" AND rank IN ({', '.join(str(int(r)) for r in ranks)})"
    return buckets(where, "rank || ':' || run_id", metric, lo, hi, n)


def episodes(run_id: str) -> str:
    """A run's alert episodes: steps they span, severity (the highest reached), latest state and message."""
    return f"""
SELECT episode, detector, CASE WHEN bool_or(severity = 'page') THEN 'page' ELSE 'warn' END AS severity,
    min(step) AS first_step, max(coalesce(last_step, step)) AS last_step,
    arg_max(state, {_CHRONO}) AS state, arg_max(message, {_CHRONO}) AS message, min(rank) AS rank
FROM anomalies WHERE run_id = {literal(run_id)} AND step IS NOT NULL
GROUP BY episode, detector ORDER BY first_step"""


def events(run_id: str, limit: int = 500) -> str:
    """A run's events at steps (evals, fault injections...) and its checkpoints with their verification."""
    run = literal(run_id)
    return f"""
SELECT * FROM (
    SELECT kind, step, rank, CAST(fields AS VARCHAR) AS detail FROM events
    WHERE run_id = {run} AND step IS NOT NULL AND kind NOT IN ('run_start', 'run_end')
    UNION ALL
    SELECT 'checkpoint', step, rank,
        CAST(json_object('origin', origin, 'ok', ok, 'path', path) AS VARCHAR) FROM checkpoints
    WHERE run_id = {run} AND step IS NOT NULL
) ORDER BY step LIMIT {int(limit)}"""


def anomalies(run_id: str | None = None, limit: int = 500) -> str:
    """Alert updates, newest first (one run's, or every run's)."""
    where = f"WHERE run_id = {literal(run_id)}" if run_id is not None else ""
    return f"""
SELECT CAST({_CHRONO} AS VARCHAR) AS time, run_id, rank, step, detector, severity, state, value, threshold, message
FROM anomalies {where} ORDER BY {_CHRONO} DESC NULLS LAST LIMIT {int(limit)}"""
