"""``vigil alerts --follow``: print alert updates live as the daemon publishes them on NATS."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import TextIO

from trainvigil.daemon.alerts.format import as_json, as_result, summary
from trainvigil.daemon.cli import _nats
from trainvigil.daemon.formatting import render, terminal_safe
from trainvigil.errors import ConfigError, DaemonUnavailableError, WireError
from trainvigil.schemas import DEFAULT_SUBJECTS, Anomaly, Subjects, decode
from trainvigil.schemas.credentials import ANONYMOUS, BusAccess
from trainvigil.schemas.natsconnect import BusConnectError, ConnectPolicy, connect
from trainvigil.schemas.natsurl import parse_nats_url


def format_update(anomaly: Anomaly, fmt: str) -> str:
    """One followed update as a line: ``table`` a sentence (safe for a terminal), ``csv`` a row, ``json`` an object
    (both exact)."""
    if fmt == "json":
        return json.dumps(as_json(anomaly)) + "\n"
    if fmt == "csv":
        return render(as_result([anomaly]), "csv").split("\n", 1)[1]
    return terminal_safe(summary(anomaly)) + "\n"


async def _follow(url: str, run_id: str | None, fmt: str, out: TextIO, access: BusAccess, subjects: Subjects) -> None:
    async def disconnected() -> None:
        print("vigil: lost the broker; reconnecting", file=sys.stderr, flush=True)

    parsed = parse_nats_url(url)
    _nats.load_for(parsed)
    # Reconnect forever once connected (a broker restart must not end --follow), but give up
    # on the first connection after a few seconds: then nothing is there.
    policy = ConnectPolicy(connect_timeout=1, deadline=3, reconnect=True, disconnected_cb=disconnected)
    try:
        nc = await connect(parsed, access, policy)
    except BusConnectError as exc:
        if exc.refused:
            raise ConfigError(str(exc), key="nats_creds") from None
        raise DaemonUnavailableError(f"no broker answered at {parsed}; start `vigil up` or pass --nats URL") from None
    subject = subjects.alert(run_id) if run_id is not None else subjects.alerts
    try:
        sub = await nc.subscribe(subject)
        await nc.flush()
        print(f"vigil: following {subject} on {parsed}; Ctrl-C to stop", file=sys.stderr, flush=True)
        if fmt == "csv":
            out.write(render(as_result([]), "csv"))
            out.flush()
        async for msg in sub.messages:
            try:
                records = decode(msg.data).records
            except WireError as exc:
                said = terminal_safe(f"skipped an unreadable message on {msg.subject}: {exc}")
                print(f"vigil: {said}", file=sys.stderr, flush=True)
                continue
            for record in records:
                # Subject tokens are sanitised run ids: compare the real one.
                if isinstance(record, Anomaly) and (run_id is None or record.run_id == run_id):
                    out.write(format_update(record, fmt))
                    out.flush()
    finally:
        await nc.close()


def follow(
    url: str,
    run_id: str | None,
    fmt: str,
    out: TextIO = sys.stdout,
    access: BusAccess = ANONYMOUS,
    subjects: Subjects = DEFAULT_SUBJECTS,
) -> None:
    """Print every alert update of ``subjects``' namespace published on the broker at ``url`` until Ctrl-C.

    Args:
        access: a reader's credentials and the CA to trust.
        subjects: the namespace whose alerts to follow (another's are never seen).

    Raises:
        ConfigError: ``url`` is not a NATS URL, or the broker turned these credentials away.
        DaemonUnavailableError: no broker answers at ``url``.
    """
    # A shell script's background job (`vigil alerts --follow &`) starts with SIGINT ignored, and Python then
    # keeps ignoring it: Ctrl-C (or `kill -INT`) must still end the follow.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    asyncio.run(_follow(url, run_id, fmt, out, access, subjects))
