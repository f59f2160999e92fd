"""``vigil push``: deliver the spill files agents kept when no broker took their data (or that killed agents left).

It runs where training ran: the agent install is enough (no daemon extra).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trainvigil.daemon.cli._config import add_creds, add_namespace, add_nats, namespace_subjects
from trainvigil.daemon.cli._exits import EXIT_OK
from trainvigil.schemas.redact import redact_url

PUSH_PROGRESS_S = 5.0
"""``vigil push`` says how far a file got at most this often while it goes."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    add_nats(push, "broker URL (default VIGIL_NATS_URL, else nats://127.0.0.1:4222)")
    add_creds(push, "an agent's credentials file (VIGIL_NATS_CREDS)")
    add_namespace(push, "the namespace the files' agents published in (VIGIL_NAMESPACE; default: the default one)")
    push.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib
    import itertools
    import time

    from trainvigil.agents.options import DEFAULT_NATS_URL, default_spill_dir
    from trainvigil.agents.spill._orphans import LIVE, adopt, adopt_orphans
    from trainvigil.agents.spill.push import FileResult, PushIncompleteError, broker_key, leftovers, push
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
