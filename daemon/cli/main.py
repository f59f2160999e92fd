"""The ``vigil`` command line.

Exit codes: each command's are in one table, ``daemon/cli/_exits.py``, which ends every ``--help`` and the
docs' CLI reference.

Every failure is one line on stderr, ``vigil: ...``, saying what to do next; a mistyped flag or value is
refused before anything starts, with the closest valid one.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainvigil._version import __version__
from trainvigil.agents import verify
from trainvigil.daemon.cli import _exits, checkpoints, shards
from trainvigil.daemon.cli._config import add_namespace, command_config, namespace_subjects
from trainvigil.daemon.cli._exits import EXIT_OK, EXIT_PARTIAL, EXIT_QUERY, EXIT_TRUNCATED, EXIT_UNAVAILABLE, EXIT_USAGE
from trainvigil.daemon.cli._parser import Parser
from trainvigil.daemon.formatting import terminal_safe
from trainvigil.schemas.redact import redact_url

if TYPE_CHECKING:
    import duckdb

    from trainvigil.daemon.broker.teams import Team
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.schemas.credentials import BusAccess
    from trainvigil.schemas.query import QueryResult

PUSH_PROGRESS_S = 5.0
"""``vigil push`` says how far a file got at most this often while it goes."""

RUNS_SQL = """
SELECT r.run_id,
       CASE WHEN r.status = 'running' AND EXISTS (
                SELECT 1 FROM anomalies a WHERE a.run_id = r.run_id AND a.detector = 'run_failed'
                AND a.value IS NOT NULL AND a.state <> 'cleared')
            THEN 'lost' ELSE r.status END AS status,
       r.world_size,
       count(s.step) AS steps, max(s.step) AS last_step, r.last_seen,
       (SELECT coalesce(sum(d.count), 0) FROM data_loss d
        WHERE d.time >= r.first_seen AND d.time - INTERVAL 7 DAY <= coalesce(r.ended_at, r.last_seen))
           AS maybe_lost
FROM runs r LEFT JOIN steps s USING (run_id)
GROUP BY ALL ORDER BY r.last_seen DESC
"""
"""``status``: ``lost`` for a running run with an open ``run_failed`` page for a rank that vanished
(that page's ``value`` is the silence in seconds). ``maybe_lost``: stream messages recorded lost
(``data_loss``) while the run may have been
publishing: a lost message is at most ``stream.max_age_s`` (7 days by default) older than the
moment its loss was found, and which run it belonged to is unknowable."""


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(
        prog="vigil", description="trainvigil: observability for ML training (agents -> NATS -> DuckDB)."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser(
        "up",
        help="run the daemon (sidecar): embedded nats-server unless --nats, data in --data-dir",
        description="Run the daemon until SIGTERM/SIGINT. Without --nats it uses 127.0.0.1:4222 if a broker "
        "answers there, else starts the bundled nats-server with JetStream storage under DATA_DIR. It serves the "
        "web view (runs, their curves, alerts) at http://127.0.0.1:9464/, Prometheus metrics at /metrics and a "
        "health check at /healthz on the same port: --http-host and --http-port move them, --http-port 0 turns "
        "them off.",
    )
    up.add_argument("--data-dir", help="where vigil.duckdb lives (default ./vigil-data, VIGIL_DATA_DIR)")
    up.add_argument(
        "--nats",
        dest="nats_url",
        help="broker URL, or a cluster's node URLs comma-separated (VIGIL_NATS_URL); default: embedded",
    )
    up.add_argument(
        "--shard",
        metavar="I/N",
        help="own the runs the broker partitions to shard I of N, with its own stream, consumer and data "
        "directory (VIGIL_SHARD; needs --nats; see `vigil shards`)",
    )
    up.add_argument(
        "--embedded-port",
        type=int,
        help="port of the bundled nats-server, and where a running broker is looked for first "
        "(default 4222, VIGIL_EMBEDDED_PORT)",
    )
    up.add_argument("--config", help="TOML configuration file")
    add_namespace(
        up,
        "serve only this namespace's agents and commands, on a broker that several deployments share "
        "(VIGIL_NAMESPACE; default: the default namespace)",
    )
    up.add_argument(
        "--http-host", help="address of the web view (/), /metrics and /healthz (default 127.0.0.1, VIGIL_HTTP_HOST)"
    )
    up.add_argument(
        "--http-port",
        type=int,
        help="port of the web view (/), /metrics and /healthz (default 9464, 0 = off, VIGIL_HTTP_PORT)",
    )
    up.add_argument("--drain", action="store_true", help="exit once every message in the stream is stored")
    up.add_argument(
        "--embedded-host",
        help="address the bundled nats-server listens on (default 127.0.0.1, VIGIL_EMBEDDED_HOST); off loopback "
        "it requires credentials",
    )
    up.add_argument(
        "--auth",
        dest="embedded_auth",
        action="store_const",
        const="on",
        help="users and permissions on the bundled nats-server even on loopback (VIGIL_EMBEDDED_AUTH=on); "
        "credentials are written once under DATA_DIR/bus",
    )
    _creds_arg(up, "the daemon's credentials file (VIGIL_NATS_CREDS); default DATA_DIR/bus/daemon.toml")

    shards.add_parser(sub)

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
        "print each update (open, escalated, degraded, cleared) as the daemon publishes it, until Ctrl-C.",
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
    push = sub.add_parser(
        "push",
        help="deliver the spill files of runs that ended (or were killed) without a broker",
        description="Publish the spill files that agents kept when no broker took their data (see the docs' "
        "'Offline runs' guide), and the spill files of agents that were killed, oldest first, each message with its "
        "original Nats-Msg-Id; a file is removed once JetStream acknowledged all of it. Needs only the agent "
        "install.",
    )
    push.add_argument(
        "dir",
        nargs="?",
        help="spill directory, or one file (default VIGIL_SPILL_DIR, else $XDG_CACHE_HOME/trainvigil/spill or "
        "~/.cache/trainvigil/spill)",
    )
    push.add_argument("--nats", dest="nats_url", help="broker URL (default VIGIL_NATS_URL, else nats://127.0.0.1:4222)")
    _creds_arg(push, "an agent's credentials file (VIGIL_NATS_CREDS)")
    add_namespace(push, "the namespace the files' agents published in (VIGIL_NAMESPACE; default: the default one)")
    auth = sub.add_parser(
        "auth",
        help="create the bus's users (agent, daemon, reader) and a nats-server config enforcing them",
        description="Write DIR/agent.toml, DIR/daemon.toml and DIR/reader.toml (random passwords, mode 0600; "
        "kept if there) and DIR/nats-server.conf, the account and permissions to run a nats-server with "
        "(nats-server -c DIR/nats-server.conf -js). Point each process at its file with VIGIL_NATS_CREDS. "
        "vigil up --auth does the same for its bundled broker under DATA_DIR/bus. The agent user may publish "
        "every run; with --team NAME=RUN,... a team's agents get a user of their own (DIR/agent-NAME.toml) "
        "limited to its own runs.",
    )
    auth.add_argument("dir", help="directory for the files (created mode 0700)")
    auth.add_argument(
        "--team",
        action="append",
        type=_team,
        default=[],
        metavar="NAME=RUN[,RUN...]",
        help="also write DIR/agent-NAME.toml, agents limited to their own runs: they may publish records of "
        "these run ids only (and read their own acks only); repeat for each team. Kept in DIR/teams.json for "
        "every later start; naming a team again replaces its runs. Run ids one by one: NATS permissions "
        "match whole subject tokens, so no run-id prefix can be granted",
    )
    auth.add_argument(
        "--shards",
        type=shards.shard_count,
        metavar="N",
        help="also partition runs over N daemon shards (the account's subject mappings; see `vigil shards`)",
    )
    add_namespace(
        auth, "grant agents and readers this namespace's subjects (VIGIL_NAMESPACE; default: the default one)"
    )
    from trainvigil.daemon.cli.export import TABLES  # light: no daemon packages at import

    export = sub.add_parser(
        "export",
        help="write every row of a run (no row limit), as CSV or Parquet",
        description="Write every row of one run's table, however many, past the query row limit and byte "
        "budget: read from the running daemon a page at a time (or the data directory's file if none runs). "
        "CSV goes to stdout unless -o; -o FILE is written to a temp file and renamed once complete. "
        "Progress on stderr.",
    )
    export.add_argument("run", help="the run id (see `vigil runs`)")
    export.add_argument("--table", choices=list(TABLES), default="steps", help="default: steps")
    export.add_argument("--format", choices=["csv", "parquet"], default="csv", help="default: csv")
    export.add_argument("-o", "--output", help="file to write (needed for parquet); default: stdout")
    export.add_argument("--data-dir", help="data directory to read when no daemon answers (default ./vigil-data)")
    export.add_argument("--nats", dest="nats_url", help="broker of the daemon (default VIGIL_NATS_URL or local)")
    export.add_argument("--config", help="the daemon's TOML configuration file (its nats_url, embedded_port, data_dir)")
    _creds_arg(export)
    add_namespace(export)
    verify.add_parser(sub)
    checkpoints.add_parser(sub, _query_args)
    # Light: their heavy imports are inside functions.
    from trainvigil.daemon.cli import bench_optim, canary, plot, report

    canary.add_parser(sub, _query_args)
    report.add_parser(sub)
    plot.add_parser(sub)
    bench_optim.add_parser(sub)
    _exits.add_to_help(parser)
    return parser


def _query_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["table", "csv", "json"], default="table", help="how rows are printed")
    parser.add_argument("--data-dir", help="data directory to read when no daemon answers (default ./vigil-data)")
    parser.add_argument("--nats", dest="nats_url", help="broker of the daemon (default VIGIL_NATS_URL or local)")
    parser.add_argument("--config", help="the daemon's TOML configuration file (its nats_url, embedded_port, data_dir)")
    parser.add_argument("--limit", type=int, default=None, help="row limit (default: the daemon's, 10000)")
    _creds_arg(parser)
    add_namespace(parser)


def _creds_arg(
    parser: argparse.ArgumentParser,
    what: str = "a reader's credentials file (VIGIL_NATS_CREDS; default DATA_DIR/bus/reader.toml if there)",
) -> None:
    # A path, never the secret itself: a command line is visible to every user of the machine (ps).
    parser.add_argument("--creds", dest="nats_creds", metavar="FILE", help=what)


def _reader(args: argparse.Namespace) -> tuple[DaemonConfig, str, BusAccess]:
    """The configuration a reading command runs with (its namespace's subjects: ``cfg.subjects``), the daemon's
    broker URL and a reader's access to it."""
    from trainvigil.daemon.broker.bus import access

    cfg = command_config(args)
    return cfg, cfg.nats_url or f"nats://127.0.0.1:{cfg.embedded_port}", access(cfg, "reader")


def _up(args: argparse.Namespace) -> int:
    import anyio

    from trainvigil.daemon import config as config_mod
    from trainvigil.daemon.app import serve
    from trainvigil.daemon.broker.bus import agents_hint
    from trainvigil.daemon.logs import configure
    from trainvigil.daemon.malloc import tune, tune_gc

    tune()  # before any thread starts: big buffers back to the system when freed (see daemon/malloc.py)
    tune_gc()  # cycles are collected rarely (see daemon/malloc.py)
    cfg = config_mod.load(
        args.config,
        {
            "data_dir": args.data_dir,
            "nats_url": args.nats_url,
            "shard": args.shard,
            "namespace": args.namespace,
            "embedded_port": args.embedded_port,
            "http_host": args.http_host,
            "http_port": args.http_port,
            "embedded_host": args.embedded_host,
            "embedded_auth": args.embedded_auth,
            "nats_creds": args.nats_creds,
        },
    )
    configure(cfg.log_format, cfg.log_level)
    _check_data_dir(cfg.data_dir)

    started: list[str] = []

    def ready(url: str) -> None:
        started.append(url)
        print(
            f"vigil: daemon ready; point agents at VIGIL_NATS_URL={redact_url(url)}"
            + (f" VIGIL_NAMESPACE={cfg.namespace}" if cfg.namespace else "")
            + f"{agents_hint(cfg)} "
            f"(data in {cfg.data_dir})",
            file=sys.stderr,
            flush=True,
        )
        if cfg.http_port:
            print(f"vigil: open http://{_url_host(cfg.http_host)}:{cfg.http_port}/", file=sys.stderr, flush=True)

    try:
        anyio.run(lambda: serve(cfg, drain=args.drain, on_ready=ready), backend="asyncio")
    except Exception as exc:
        # What fails once the daemon runs is not a start-up problem (a database error then is no "cannot open").
        explained = None if started else _startup_error(exc, cfg)
        if explained is None:
            raise
        raise explained from exc
    return EXIT_OK


def _url_host(host: str) -> str:
    """The host part of a URL for the address the HTTP side binds (all addresses: this machine's loopback)."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _check_data_dir(path: str) -> None:
    """Create the data directory, or say why it cannot be one (before anything starts)."""
    from trainvigil.errors import ConfigError

    where = Path(path)
    if where.exists() and not where.is_dir():
        raise ConfigError(
            f"data_dir {path} is a file, not a directory; pass --data-dir with a directory", key="data_dir"
        )
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"data_dir {path} cannot be created ({exc.strerror or exc}); pass --data-dir with a directory you can "
            "write to",
            key="data_dir",
        ) from None
    if not os.access(where, os.W_OK | os.X_OK):
        raise ConfigError(f"data_dir {path} is not writable; pass --data-dir with one you can write to", key="data_dir")


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, or what it holds when it is a group (a task group wraps what its tasks raise)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _lock_holder(exc: BaseException) -> str | None:
    """Who holds the DuckDB file, when ``exc`` says the file is locked ("process 123"), else ``None``."""
    if "lock" not in str(exc):
        return None
    pid = re.search(r"\(PID (\d+)\)", str(exc))
    return f"process {pid.group(1)}" if pid else "another process"


def _startup_error(exc: BaseException, cfg: DaemonConfig) -> Exception | None:
    """What a failed ``vigil up`` means, as the error that says what to do (``None``: not known here)."""
    import duckdb

    from trainvigil.errors import ConfigError

    for leaf in _leaves(exc):
        if isinstance(leaf, duckdb.Error) and (holder := _lock_holder(leaf)):
            return ConfigError(
                f"data_dir {cfg.data_dir} is in use by {holder} (another `vigil up`?); stop it, or give this "
                "daemon its own --data-dir",
                key="data_dir",
            )
        if isinstance(leaf, duckdb.Error):
            return ConfigError(f"data_dir: cannot open {cfg.db_path}: {leaf}", key="data_dir")
        # The HTTP listener is the only socket the daemon binds.
        if isinstance(leaf, OSError) and leaf.errno == errno.EADDRINUSE:
            return ConfigError(
                f"http_port: {cfg.http_host}:{cfg.http_port} is in use by another program; pass --http-port with a "
                "free port (0 turns HTTP off)",
                key="http_port",
            )
        if isinstance(leaf, OSError) and leaf.errno == errno.EADDRNOTAVAIL:
            return ConfigError(f"http_host {cfg.http_host} is not an address of this machine", key="http_host")
    return None


def _query(args: argparse.Namespace, sql: str) -> int:
    if args.limit is not None and args.limit < 1:
        print(f"vigil: --limit must be at least 1, not {args.limit}", file=sys.stderr)
        return EXIT_USAGE
    import duckdb

    from trainvigil.daemon.cli.sqlclient import QuerySource
    from trainvigil.daemon.formatting import render

    cfg, url, bus = _reader(args)
    try:
        source = QuerySource(
            nats_url=url, data_dir=cfg.data_dir, timeout=cfg.query_timeout_s + 5, access=bus, subjects=cfg.subjects
        )
        with source:
            result = source.ask(sql, args.limit or cfg.query_row_limit)
            from_daemon = source.from_daemon
    except duckdb.Error as exc:  # opening the file: a daemon holds it, or it is not a database
        raise _unreadable(exc, url, cfg) from exc
    if not from_daemon:  # sqlclient's answer when it read the file itself
        print(f"vigil: no daemon answered at {redact_url(url)}; answered from {source.where}", file=sys.stderr)
    sys.stdout.write(render(result, args.format))
    sys.stdout.flush()
    if source.warning:  # shards missing: said even when a budget also cut the answer
        print(f"vigil: {source.warning}", file=sys.stderr)
    if result.truncated:
        print(_truncation(result, args.limit, cfg.query_row_limit), file=sys.stderr)
    return EXIT_PARTIAL if source.warning else EXIT_TRUNCATED if result.truncated else EXIT_OK


def _truncation(result: QueryResult, limit: int | None, default_limit: int) -> str:
    """One line saying how much came, which budget cut it, and how to get everything."""
    n = len(result.rows)
    if result.truncated_by == "bytes":
        why = f"the answer's byte budget (query_max_bytes): {result.note}"
    elif result.truncated_by == "rows" and limit == n:
        why = f"--limit {n}"
    elif result.truncated_by == "rows" and n < (limit or default_limit):
        why = f"the daemon's query_row_limit, {n} (a larger --limit is lowered to it)"
    elif result.truncated_by == "rows":
        why = f"the row limit, query_row_limit = {n} (raise it with --limit)"
    else:  # a daemon older than truncated_by
        why = result.note or "a budget of the daemon"
    return (
        f"vigil: truncated: {n} rows returned, cut by {why}; the rest is missing. Every row of a run: "
        "vigil export RUN [--table T] [--format csv|parquet]; else narrow the query (WHERE, LIMIT)"
    )


def _unreadable(exc: duckdb.Error, url: str, cfg: DaemonConfig) -> Exception:
    from trainvigil.errors import DaemonUnavailableError

    if holder := _lock_holder(exc):
        return DaemonUnavailableError(
            f"no daemon answered at {redact_url(url)}, and {cfg.db_path} is locked by {holder} (a daemon on another "
            "broker?); query through that daemon: --nats URL, or --config with its configuration file"
        )
    return DaemonUnavailableError(f"no daemon answered at {redact_url(url)}, and {cfg.db_path} cannot be read: {exc}")


def _saved_by(args: argparse.Namespace) -> None:
    """After ``vigil verify``: which run and step saved the manifest's content, if the daemon knows it.
    Best effort: without the daemon extra, or with no history to ask, it says why in one line."""
    from trainvigil.agents.checkpoint import read_manifest

    try:
        from trainvigil.daemon.cli.checkpoints import writer_sql
        from trainvigil.daemon.cli.sqlclient import query

        expected, _ = read_manifest(args.path)
        cfg, url, bus = _reader(args)
        result, _ = query(
            writer_sql(expected.root),
            nats_url=url,
            data_dir=cfg.data_dir,
            limit=5,
            timeout=10,
            access=bus,
            subjects=cfg.subjects,
        )
    except Exception as exc:  # no daemon extra, no daemon and no file, refused credentials: verify's verdict stands
        print(
            f"vigil verify: who saved it is unknown ({type(exc).__name__}: {terminal_safe(str(exc))})", file=sys.stderr
        )
        return
    if not result.rows:
        print(f"{args.path}: no save with this content ({expected.algo} {expected.root[:16]}) is in the history")
        return
    run_id, rank, step, saved_at, path = result.rows[0]
    others = f" (and {len(result.rows) - 1} more saves of the same content)" if len(result.rows) > 1 else ""
    # The run and the path come from the history, that is from an agent: shown as text.
    saved = terminal_safe(f"run {run_id} rank {rank} at step {step} ({saved_at}, as {path}){others}")
    print(f"{args.path}: saved by {saved}")


def _export(args: argparse.Namespace) -> int:
    import duckdb

    from trainvigil.daemon.cli.export import TABLES, Progress, count_rows, export_rows, output, target
    from trainvigil.daemon.cli.sqlclient import QuerySource

    cfg, url, bus = _reader(args)
    table, path = TABLES[args.table], target(args.output, args.format)
    source = QuerySource(
        nats_url=url,
        data_dir=cfg.data_dir,
        timeout=cfg.query_timeout_s + 5,
        access=bus,
        busy_patience_s=60.0,
        subjects=cfg.subjects,
    )
    with source:
        ask = source.ask
        try:
            total = count_rows(ask, table, args.run)  # the first query: it decides daemon or file
        except duckdb.Error as exc:  # opening the file: a daemon holds it, or it is not a database
            raise _unreadable(exc, url, cfg) from exc
        if not source.from_daemon:
            print(f"vigil: no daemon answered at {redact_url(url)}; reading {source.where}", file=sys.stderr)
        what = f"export of run {args.run} ({table.name})"
        with output(path, binary=args.format == "parquet") as out:
            rows = export_rows(
                ask, table, args.run, args.format, out, page_rows=cfg.query_row_limit, progress=Progress(what, total)
            )
    print(f"vigil: exported {rows} rows of run {args.run} ({table.name}) to {path or 'stdout'}", file=sys.stderr)
    return EXIT_OK


def _alerts(args: argparse.Namespace) -> int:
    from trainvigil.daemon.cli.alerts import alerts_sql, follow

    if not args.follow:
        return _query(args, alerts_sql(args.run))
    cfg, url, bus = _reader(args)
    follow(url, args.run, args.format, access=bus, subjects=cfg.subjects)
    return EXIT_OK


def _push(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib
    import itertools
    import time

    from trainvigil.agents._orphans import LIVE, adopt, adopt_orphans
    from trainvigil.agents.options import DEFAULT_NATS_URL, default_spill_dir
    from trainvigil.agents.push import FileResult, PushIncompleteError, broker_key, leftovers, push
    from trainvigil.errors import ConfigError
    from trainvigil.schemas.credentials import BusAccess

    where = Path(args.dir or os.environ.get("VIGIL_SPILL_DIR") or default_spill_dir())
    if args.dir and not where.exists():
        raise ConfigError(f"{where} does not exist; pass a spill directory (VIGIL_SPILL_DIR) or file", key="dir")
    adopted: list[Path] = []
    if where.is_dir():
        adopted = adopt_orphans(where)
    elif where.name.endswith(LIVE):  # a spill file named by hand: only once its agent is gone
        sealed = adopt(where)
        if sealed is None:
            raise ConfigError(
                f"{where} is the spill file of an agent that is still running (it sends it itself), or of one "
                "that could not lock it; it is left untouched",
                key="dir",
            )
        adopted, where = [sealed], sealed
    for path in adopted:
        print(f"vigil: {path.name}: the spill file of a killed agent, sealed for pushing", file=sys.stderr)
    paths = leftovers(where)
    if not paths:
        print(f"vigil: nothing to push in {where}", file=sys.stderr)
        return EXIT_OK
    url = args.nats_url or os.environ.get("VIGIL_NATS_URL") or DEFAULT_NATS_URL
    key = broker_key(url)
    counter = itertools.count(1)

    def progress(r: FileResult) -> None:
        done = "delivered" if r.done else "skipped (another process has it)" if r.skipped else "NOT delivered"
        if r.done and r.empty:
            done = "held no messages (a header only), removed"
        meant = f" (kept for {redact_url(r.broker)})" if r.broker and r.broker != key else ""
        print(
            f"vigil: [{next(counter)}/{len(paths)}] {r.path.name}{meant}: {done}, {r.messages} messages, "
            f"{r.bytes} bytes" + (f"; {r.error}" if r.error else ""),
            file=sys.stderr,
            flush=True,
        )

    said = [time.monotonic()]

    def sending(r: FileResult) -> None:  # a big file: a line every PUSH_PROGRESS_S while it goes
        if (now := time.monotonic()) - said[0] >= PUSH_PROGRESS_S:
            said[0] = now
            size = ""
            with contextlib.suppress(OSError):
                size = f" of {r.path.stat().st_size / 2**20:.1f} MiB"
            print(
                f"vigil: {r.path.name}: {r.bytes / 2**20:.1f} MiB{size} sent so far, {r.messages} messages",
                file=sys.stderr,
                flush=True,
            )

    creds = args.nats_creds or os.environ.get("VIGIL_NATS_CREDS", "")
    bus = BusAccess(creds=creds, tls_ca=os.environ.get("VIGIL_NATS_TLS_CA", ""))
    subjects = namespace_subjects(args)
    results = asyncio.run(push(url, paths, on_file=progress, on_round=sending, access=bus, subjects=subjects))
    print(
        f"vigil: pushed {sum(r.done for r in results)} of {len(paths)} files to {redact_url(url)}: "
        f"{sum(r.messages for r in results)} messages, {sum(r.bytes for r in results)} bytes",
        file=sys.stderr,
    )
    if failed := [r for r in results if r.error]:
        raise PushIncompleteError(
            f"{len(failed)} of {len(paths)} files not delivered in full (first: {failed[0].path}: {failed[0].error}); "
            f"they stay in {where}: is the daemon running (vigil up creates the stream)? then run vigil push again",
            failed=failed,
        )
    return EXIT_OK


def _team(text: str) -> Team:
    """An argparse type: ``--team NAME=RUN[,RUN...]``."""
    from trainvigil.daemon.broker.teams import parse_team

    try:
        return parse_team(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _auth(args: argparse.Namespace) -> int:
    from trainvigil.daemon.broker.auth import ROLES, credentials_file, prepare
    from trainvigil.daemon.broker.teams import read_teams

    where = Path(args.dir)
    config = prepare(where, shards=args.shards, teams=args.team, subjects=namespace_subjects(args))
    users = [*ROLES, *(team.user for team in read_teams(where).values())]
    files = ", ".join(f"{user}: {credentials_file(where, user)}" for user in users)
    print(f"vigil: bus users in {where} ({files}); server config: {config}", file=sys.stderr)
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from trainvigil.daemon.cli.demo import run_demo

    return run_demo(steps=args.steps, keep=args.keep)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "verify":  # needs torch, not the daemon extra
        code = verify.run(args)
        if code in (verify.EXIT_MATCH, verify.EXIT_MISMATCH) and Path(args.path).is_file():
            _saved_by(args)
        return code
    daemon_extra = args.command != "push"  # push runs where training ran: the agent install is enough
    try:
        if daemon_extra:
            import anyio  # noqa: F401
            import duckdb  # noqa: F401
            import structlog  # noqa: F401
    except ImportError as exc:
        print(
            f"vigil: the daemon needs extra packages ({exc.name}); install them with: pip install 'trainvigil[daemon]'",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    from trainvigil.agents.push import NoBrokerError, PushIncompleteError
    from trainvigil.daemon.cli.export import ExportWriteError, UnknownRunError
    from trainvigil.errors import ConfigError, DaemonUnavailableError, QueryError, QueryRefusedError, ReplayError

    # What each failure prints and exits with (first match wins). Errors of the libraries
    # underneath are turned into these where their meaning is known (_startup_error, _unreadable).
    failures: dict[type[Exception], tuple[str, int]] = {
        QueryRefusedError: ("refused: ", EXIT_QUERY),
        UnknownRunError: ("", EXIT_USAGE),
        ExportWriteError: ("", EXIT_QUERY),
        QueryError: ("query failed: ", EXIT_QUERY),
        ReplayError: ("cannot replay: ", EXIT_USAGE),
        PushIncompleteError: ("push incomplete: ", EXIT_QUERY),
        ConfigError: ("configuration error: ", EXIT_USAGE),
        DaemonUnavailableError: ("", EXIT_UNAVAILABLE),
        NoBrokerError: ("", EXIT_UNAVAILABLE),
    }
    if daemon_extra:
        from trainvigil.daemon.broker.embedded import BrokerUnavailableError, NatsServerNotFoundError

        failures |= {BrokerUnavailableError: ("", EXIT_UNAVAILABLE), NatsServerNotFoundError: ("", EXIT_UNAVAILABLE)}

    try:
        if args.command == "up":
            return _up(args)
        if args.command == "sql":
            return _query(args, args.sql)
        if args.command == "shards":
            return shards.run(args)
        if args.command == "runs":
            return _query(args, RUNS_SQL)
        if args.command == "checkpoints":
            return _query(args, checkpoints.registry_sql(args.run))
        if args.command == "alerts":
            return _alerts(args)
        if args.command == "export":
            return _export(args)
        if args.command == "replay":
            from trainvigil.daemon import config as config_mod
            from trainvigil.daemon.cli.replay import replay_file

            if not replay_file(args.file, args.format, config_mod.load(args.config), sys.stdout):
                print(f"vigil: no alerts: the detectors raised nothing on {args.file}", file=sys.stderr)
            return EXIT_OK
        if args.command == "demo":
            return _demo(args)
        if args.command == "push":
            return _push(args)
        if args.command == "auth":
            return _auth(args)
        if args.command == "canary":
            from trainvigil.daemon.cli import canary

            if args.action == "list":
                return _query(args, canary.list_sql(args.last))
            return canary.run(args)
        if args.command == "bench-optim":
            from trainvigil.daemon.cli import bench_optim

            return bench_optim.run(args)
        if args.command == "report":
            from trainvigil.daemon.cli import report

            return report.run(args, *_reader(args))
        if args.command == "plot":
            from trainvigil.daemon.cli import plot

            return plot.run(args, *_reader(args))
    except Exception as exc:
        known = next(((e, v) for e in _leaves(exc) for t, v in failures.items() if isinstance(e, t)), None)
        if known is None:
            raise
        error, (prefix, code) = known
        # One line, always, and safe for a terminal: a query's error may quote a run id or metric name.
        print("vigil: " + terminal_safe(" ".join(f"{prefix}{error}".split())), file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return EXIT_OK
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
