"""``vigil plot RUN_ID``: a PNG of a run's curves, one panel per metric, alert episodes and events marked.

Reads like ``vigil sql`` (the running daemon, else the data directory's file read-only) with the
web view's queries: the same min/max buckets (at most ~2 000 points per series) and episodes.
matplotlib comes with the ``plot`` extra.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainvigil.daemon.cli._exits import EXIT_UNAVAILABLE

if TYPE_CHECKING:
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.schemas.credentials import BusAccess
    from trainvigil.schemas.query import QueryResult

Ask = Callable[[str], "QueryResult"]
SEVERITY_COLOURS = {"page": "#d62728", "warn": "#f28e2b"}


def _records(result: QueryResult) -> list[dict[str, Any]]:
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def _csv(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def default_output(run_id: str) -> Path:
    return Path(re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("._") or "run").with_suffix(".png")


def gather(ask: Ask, run_id: str, metrics: Sequence[str], ranks: Sequence[int]) -> dict[str, Any]:
    """What the plot shows, read with the web view's queries.

    Raises:
        UnknownRunError: the run is not in the history.
        ConfigError: a metric asked for is not one the run logged.
    """
    from trainvigil.daemon.cli.export import UnknownRunError
    from trainvigil.daemon.web import sql
    from trainvigil.errors import ConfigError
    from trainvigil.schemas import KNOWN_METRICS

    info = _records(ask(sql.run_info(run_id)))
    if not info:
        raise UnknownRunError(f"no run {run_id!r} in the history; list them with: vigil runs")
    logged = [m for m in KNOWN_METRICS if info[0][m]] + list(info[0]["custom"] or [])
    chosen = list(metrics) or logged
    missing = [m for m in chosen if m not in logged]
    if missing:
        raise ConfigError(unknown_metrics(run_id, missing, logged), key="metrics")
    n = sql.bucket_count(len(ranks) or len(info[0]["ranks"] or [0]))
    series = {m: sql.points(ask(sql.run_series(run_id, m, ranks, None, None, n)).rows) for m in chosen}
    return {
        "series": series,
        "episodes": _records(ask(sql.episodes(run_id))),
        "events": _records(ask(sql.events(run_id))),
        "status": info[0]["status"],
    }


def unknown_metrics(run_id: str, missing: Sequence[str], logged: Sequence[str]) -> str:
    """The one-line error for ``--metrics`` naming metrics the run did not log: each with the closest the run
    has, then all of them (an empty panel would say nothing about a typo)."""
    from trainvigil.schemas import KNOWN_METRICS

    known = [m for m in logged if m in KNOWN_METRICS]
    named = []
    for metric in missing:
        # A typo of a known metric first: a run that logged ``grad_nrom`` too still gets ``grad_norm`` for ``grad_nrm``.
        close = difflib.get_close_matches(metric, known, n=1) or difflib.get_close_matches(metric, logged, n=1)
        named.append(f"{metric!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"--metrics: run {run_id!r} logged no metric {', '.join(named)}; its metrics: {', '.join(logged) or 'none'}"


def draw(run_id: str, data: dict[str, Any], output: Path) -> int:
    """Write the PNG; returns the number of panels drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(data["series"])
    fig, axes = plt.subplots(len(metrics), 1, figsize=(10, 2.6 * len(metrics)), sharex=True, squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        for key, points in sorted(data["series"][metric].items(), key=lambda kv: int(kv[0])):
            ax.plot(points["x"], points["y"], linewidth=1.0, label=f"rank {key}")
        for ep in data["episodes"]:
            colour = SEVERITY_COLOURS.get(ep["severity"], "#7f7f7f")
            ax.axvspan(ep["first_step"], max(ep["last_step"], ep["first_step"] + 0.5), color=colour, alpha=0.25)
        for ev in data["events"]:
            ax.axvline(ev["step"], color="#6b7280", linestyle="--", linewidth=0.8)
        ax.set_ylabel(metric + (" (s)" if metric == "step_time" else ""))
        ax.grid(alpha=0.3)
        if not data["series"][metric]:
            ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center", color="#6b7280")
        elif len(data["series"][metric]) > 1:
            ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("step")
    opened = {ep["detector"]: ep["severity"] for ep in data["episodes"]}
    alerts = ", ".join(f"{d} ({s})" for d, s in sorted(opened.items()))
    fig.suptitle(f"{run_id} ({data['status']})" + (f" · alerts: {alerts}" if alerts else ""), fontsize=11)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return len(metrics)


def run(args: argparse.Namespace, cfg: DaemonConfig, url: str, access: BusAccess) -> int:
    """``vigil plot``; the exit status."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("vigil: plot needs matplotlib; install it with: pip install 'trainvigil[plot]'", file=sys.stderr)
        return EXIT_UNAVAILABLE
    from trainvigil.daemon.cli.sqlclient import QuerySource
    from trainvigil.errors import ConfigError

    try:
        ranks = [int(r) for r in _csv(args.ranks)]
    except ValueError:
        raise ConfigError(f"--ranks {args.ranks!r}: give ranks as numbers, e.g. 0,1", key="ranks") from None
    output = Path(args.output) if args.output else default_output(args.run_id)
    source = QuerySource(
        nats_url=url, data_dir=cfg.data_dir, timeout=cfg.query_timeout_s + 5, access=access, subjects=cfg.subjects
    )
    with source:
        data = gather(lambda text: source.ask(text, cfg.query_row_limit), args.run_id, _csv(args.metrics), ranks)
        if not source.from_daemon:
            print(f"vigil: no daemon answered at {url}; read {source.where}", file=sys.stderr)
    panels = draw(args.run_id, data, output)
    print(f"vigil: wrote {output} ({panels} panels)", file=sys.stderr)
    return 0
