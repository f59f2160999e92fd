"""``vigil export``: every row of one run's table, past the query row limit and byte budget, as CSV or Parquet."""

from __future__ import annotations

import argparse
import sys

from trainvigil.daemon.cli._answer import unreadable
from trainvigil.daemon.cli._config import add_daemon_flags, reader
from trainvigil.daemon.cli._exits import EXIT_OK
from trainvigil.daemon.cli._failures import is_duckdb_error
from trainvigil.daemon.cli.export import TABLES
from trainvigil.schemas.redact import redact_url


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    add_daemon_flags(export)
    export.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    from trainvigil.daemon.cli.export import Progress, count_rows, export_rows, output, target
    from trainvigil.daemon.cli.sqlclient import QuerySource

    cfg, url, bus = reader(args)
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
        except Exception as exc:
            if not is_duckdb_error(exc):
                raise
            raise unreadable(exc, url, cfg) from exc  # opening the file: a daemon holds it, or it is not a database
        if not source.from_daemon:
            print(f"vigil: no daemon answered at {redact_url(url)}; reading {source.where}", file=sys.stderr)
        what = f"export of run {args.run} ({table.name})"
        with output(path, binary=args.format == "parquet") as out:
            rows = export_rows(
                ask, table, args.run, args.format, out, page_rows=cfg.query_row_limit, progress=Progress(what, total)
            )
    print(f"vigil: exported {rows} rows of run {args.run} ({table.name}) to {path or 'stdout'}", file=sys.stderr)
    return EXIT_OK
