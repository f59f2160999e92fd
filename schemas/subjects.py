"""NATS subjects: ``vigil.v1.<run>.<kind>``, alerts and control subjects."""

from __future__ import annotations

import re
from typing import Literal

from .records import SCHEMA_MAJOR

PREFIX = f"vigil.v{SCHEMA_MAJOR}"
Kind = Literal["metrics", "gil", "ckpt", "run", "hb"]
KINDS: tuple[str, ...] = ("metrics", "gil", "ckpt", "run", "hb")
STREAM_SUBJECTS: list[str] = [f"{PREFIX}.*.{kind}" for kind in KINDS]
"""What the JetStream stream captures: agent data only, never alerts or control requests."""
QUERY_SUBJECT = f"{PREFIX}.ctl.sql"

# Tokens that would make a run subject collide with alerts/control subjects.
_RESERVED = frozenset({"alerts", "ctl", *KINDS})
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_TOKEN = 128


def run_token(run_id: str) -> str:
    """``run_id`` as one subject token: only ``[A-Za-z0-9_-]``, never empty or reserved.

    The mapping is lossy on purpose (the envelope carries the real run id); it only
    routes messages.
    """
    token = _UNSAFE.sub("_", run_id)[:_MAX_TOKEN] or "_"
    if token in _RESERVED:
        token = "_" + token
    return token


def data_subject(run_id: str, kind: Kind) -> str:
    """The subject an agent publishes ``kind`` records of ``run_id`` on."""
    return f"{PREFIX}.{run_token(run_id)}.{kind}"


def alert_subject(run_id: str) -> str:
    """The subject the daemon publishes anomalies of ``run_id`` on."""
    return f"{PREFIX}.alerts.{run_token(run_id)}"
