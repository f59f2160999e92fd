"""How alert updates read: as rows (table, CSV, JSON lines via ``formatting.render``), as one line of text,
and as that line made safe for a chat receiver to render."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

from trainvigil.daemon.formatting import render
from trainvigil.schemas import Anomaly
from trainvigil.schemas.query import QueryResult

REPLAY_FIELDS: tuple[str, ...] = (
    "run_id",
    "rank",
    "step",
    "detector",
    "severity",
    "state",
    "value",
    "baseline",
    "threshold",
    "message",
)
"""What ``vigil replay`` prints per update."""

ALL_FIELDS: tuple[str, ...] = ("time", *REPLAY_FIELDS, "episode", "last_step")
"""Every field of an update (``time``: Unix seconds)."""


def as_result(anomalies: list[Anomaly], fields: tuple[str, ...] = ALL_FIELDS) -> QueryResult:
    """``anomalies`` as rows, so every output format of ``vigil sql`` applies to them."""
    return QueryResult(columns=list(fields), rows=[[getattr(a, f) for f in fields] for a in anomalies])


def as_json(anomaly: Anomaly, fields: tuple[str, ...] = ALL_FIELDS) -> dict[str, object]:
    """One update as a JSON-safe dict (a NaN value becomes the string ``"NaN"``, as in ``vigil sql``)."""
    result: dict[str, object] = json.loads(render(as_result([anomaly], fields), "json"))
    return result


def summary(anomaly: Anomaly) -> str:
    """One line a person reads first: what, where, how bad, and the detector's advice."""
    a = anomaly
    when = datetime.fromtimestamp(a.time, UTC).strftime("%Y-%m-%d %H:%M:%S")
    where = f"run {a.run_id} rank {a.rank}" + (f" step {a.step}" if a.step is not None else "")
    return f"{when} [{a.severity.upper()}] {a.detector} {a.state} on {where}: {a.message}"


_JOINER = "\u2060"
"""WORD JOINER: invisible, and it splits a token so no renderer matches it (``@\u2060here`` is no mention)."""
_LINE_BREAKS = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]+")
_MENTION = re.compile(r"@(?=\w)")


def chat_escape(text: str) -> str:
    """``text`` as a chat receiver shows it literally: no mention, link or markup in it takes effect.

    For the receivers that take a webhook's ``text``: Slack (``&``, ``<``, ``>`` as entities, its own
    escaping, so ``<!channel>``, ``<!here>``, ``<@U1>`` and ``<http://x|y>`` stay text), Mattermost,
    Rocket.Chat, Discord's Slack-compatible endpoint and Teams (``@here``, ``@channel``, ``@everyone``,
    ``@all`` or ``@user`` split by a word joiner, Markdown's ``[label](url)`` broken between ``]`` and
    ``(``, and ``scheme://`` split so it is not turned into a link). Line breaks and other control
    characters become spaces: the line cannot fake a second alert below it.
    """
    text = _LINE_BREAKS.sub(" ", text)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MENTION.sub("@" + _JOINER, text)
    return text.replace("](", "]" + _JOINER + "(").replace("://", ":" + _JOINER + "//")
