"""The ``vigil`` command line.

Exit codes: 0 success; 1 the query was refused or failed; 2 bad usage or configuration;
3 the daemon's dependencies are missing, or no daemon and no data directory to answer.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import verify

EXIT_OK, EXIT_QUERY, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3

RUNS_SQL = """
SELECT r.run_id, r.status, r.world_size,
       count(s.step) AS steps, max(s.step) AS last_step, r.last_seen
FROM runs r LEFT JOIN steps s USING (run_id)
GROUP BY ALL ORDER BY r.last_seen DESC
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vigil", description="trainvigil: observability for ML training (agents -> NATS -> DuckDB)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser(
        "up",
        help="run the daemon (sidecar): embedded nats-server unless --nats, data in --data-dir",
        description="Run the daemon until SIGTERM/SIGINT. Without --nats it uses 127.0.0.1:4222 if a broker "
        "answers there, else starts the bundled nats-server with JetStream storage under DATA_DIR.",
    )
    up.add_argument("--data-dir", help="where vigil.duckdb lives (default ./vigil-data, VIGIL_DATA_DIR)")
    up.add_argument("--nats", dest="nats_url", help="broker URL (VIGIL_NATS_URL); default: embedded")
    up.add_argument("--config", help="TOML configuration file")
    up.add_argument("--http-host", help="address of /healthz and /metrics (default 127.0.0.1)")
    up.add_argument("--http-port", type=int, help="port of /healthz and /metrics (default 9464, 0 = off)")
    up.add_argument("--drain", action="store_true", help="exit once every message in the stream is stored")

    sql = sub.add_parser(
        "sql",
        help="run a read-only SQL query",
        description="Run a read-only SQL query "
        "against the running daemon (over NATS), or the data directory's file if none runs.",
    )
    sql.add_argument("sql", help='the query, e.g. "select run_id, count(*) from steps group by 1"')
    _query_args(sql)

    runs = sub.add_parser(
        "runs",
        help="list runs with step counts, last step and last seen",
        description="List runs with step counts, last step and last seen.",
    )
    _query_args(runs)

    alerts = sub.add_parser(
        "alerts",
        help="list alert episodes, or follow updates live (--follow)",
        description="List alert episodes from the anomalies table (one row per incident), or with --follow "
        "print each update (open, escalated, cleared) as the daemon publishes it, until Ctrl-C.",
    )
    alerts.add_argument("--run", help="only this run")
    alerts.add_argument("--follow", action="store_true", help="subscribe to vigil.v1.alerts.> and print updates")
    _query_args(alerts)

    replay = sub.add_parser(
        "replay",
        help="run recorded metrics through the detectors offline",
        description="Run a recording (columns run_id, rank, step, metrics, optional time in Unix seconds; "
        "empty cell = absent, nan = NaN) through the daemon's detectors and print one JSON line per alert "
        "update. No broker or daemon needed.",
    )
    replay.add_argument("file", help="the recording")
    replay.add_argument("--format", choices=["csv", "parquet", "jsonl"], help="default: from the file name")
    replay.add_argument("--config", help="TOML configuration file (its [detectors.*] tables)")

    demo = sub.add_parser(
        "demo",
        help="embedded broker + daemon + a short real training loop, then SQL",
        description="Run everything in a temporary directory with a short real training "
        "loop (torch if installed, else numpy) and print a few SQL answers.",
    )
    demo.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    demo.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    verify.add_parser(sub)
    return parser


def _query_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["table", "csv", "json"], default="table")
    parser.add_argument("--data-dir", help="data directory to read when no daemon answers (default ./vigil-data)")
    parser.add_argument("--nats", dest="nats_url", help="broker of the daemon (default VIGIL_NATS_URL or local)")
    parser.add_argument("--limit", type=int, default=None, help="row limit (default: the daemon's, 10000)")


def _up(args: argparse.Namespace) -> int:
    import anyio

    from . import config as config_mod
    from .app import serve
    from .logs import configure

    cfg = config_mod.load(
        args.config,
        {
            "data_dir": args.data_dir,
            "nats_url": args.nats_url,
            "http_host": args.http_host,
            "http_port": args.http_port,
        },
    )
    configure(cfg.log_format, cfg.log_level)

    def ready(url: str) -> None:
        print(
            f"vigil: daemon ready; point agents at VIGIL_NATS_URL={url} (data in {cfg.data_dir})",
            file=sys.stderr,
            flush=True,
        )

    anyio.run(lambda: serve(cfg, drain=args.drain, on_ready=ready), backend="asyncio")
    return EXIT_OK


def _query(args: argparse.Namespace, sql: str) -> int:
    from . import config as config_mod
    from .formatting import render
    from .sqlclient import query

    cfg = config_mod.load(None, {"data_dir": args.data_dir, "nats_url": args.nats_url})
    url = cfg.nats_url or f"nats://127.0.0.1:{cfg.embedded_port}"
    result, _where = query(
        sql,
        nats_url=url,
        data_dir=cfg.data_dir,
        limit=args.limit or cfg.query_row_limit,
        timeout=cfg.query_timeout_s + 5,
    )
    sys.stdout.write(render(result, args.format))
    return EXIT_OK


def _alerts(args: argparse.Namespace) -> int:
    from . import config as config_mod
    from .alerts_cli import alerts_sql, follow

    if not args.follow:
        return _query(args, alerts_sql(args.run))
    cfg = config_mod.load(None, {"nats_url": args.nats_url})
    follow(cfg.nats_url or f"nats://127.0.0.1:{cfg.embedded_port}", args.run, args.format)
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(steps=args.steps, keep=args.keep)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "verify":  # needs torch, not the daemon extra
        return verify.run(args)
    try:
        import anyio  # noqa: F401
        import duckdb  # noqa: F401
        import structlog  # noqa: F401
    except ImportError as exc:
        print(
            f"vigil: the daemon needs extra packages ({exc.name}); install them with: pip install 'trainvigil[daemon]'",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    from trainvigil.errors import ConfigError, DaemonUnavailableError, QueryError, QueryRefusedError, ReplayError

    # What each failure prints and exits with (first match wins).
    failures: dict[type[Exception], tuple[str, int]] = {
        QueryRefusedError: ("refused: ", EXIT_QUERY),
        QueryError: ("query failed: ", EXIT_QUERY),
        ReplayError: ("cannot replay: ", EXIT_USAGE),
        ConfigError: ("configuration error: ", EXIT_USAGE),
        DaemonUnavailableError: ("", EXIT_UNAVAILABLE),
    }

    try:
        if args.command == "up":
            return _up(args)
        if args.command == "sql":
            return _query(args, args.sql)
        if args.command == "runs":
            return _query(args, RUNS_SQL)
        if args.command == "alerts":
            return _alerts(args)
        if args.command == "replay":
            from . import config as config_mod
            from .replay import replay_file

            replay_file(args.file, args.format, config_mod.load(args.config), sys.stdout)
            return EXIT_OK
        if args.command == "demo":
            return _demo(args)
    except (QueryRefusedError, QueryError, ReplayError, ConfigError, DaemonUnavailableError) as exc:
        prefix, code = next(v for t, v in failures.items() if isinstance(exc, t))
        print(f"vigil: {prefix}{exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return EXIT_OK
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
