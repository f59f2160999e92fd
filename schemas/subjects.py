"""NATS subjects: ``vigil.v1.<run>.<kind>``, alerts and control subjects, each of one namespace.

A **namespace** lets several deployments (staging and production, two teams, many test daemons) share one
broker: the subjects of namespace ``N`` are the default ones with ``N.`` in front (``N.vigil.v1.<run>.<kind>``,
``N.vigil.v1.alerts.<run>``, ``N.vigil.v1.ctl.sql``...), and its stream is ``VIGIL_N``. In front, because
NATS wildcards match whole tokens from the left: every pattern of the default namespace starts with the
literal tokens ``vigil.v1``, which a namespaced subject never has in that place (its first token is ``N``,
its second ``vigil``), so no subscription, stream or permission of one namespace ever matches another's.
The default namespace (empty) keeps the subjects and stream of a daemon without one, unchanged.

Everything that publishes or subscribes takes a :class:`Subjects` value, the one place subjects are spelled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from trainvigil.errors import ConfigError

from .records import SCHEMA_MAJOR

Kind = Literal["metrics", "gil", "ckpt", "run", "hb"]
KINDS: tuple[str, ...] = ("metrics", "gil", "ckpt", "run", "hb")
NAMESPACE_RULE = "empty, or 1-32 letters, digits, '_' and '-' starting with a letter or digit"
"""What a namespace may be: one subject token, and part of a JetStream stream name."""
STREAM = "VIGIL"
"""The default namespace's stream (``stream.name``'s default); namespace ``N``'s is ``VIGIL_N``."""

_VERSION = f"vigil.v{SCHEMA_MAJOR}"
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
# Tokens that would make a run subject collide with alerts/control subjects.
_RESERVED = frozenset({"alerts", "ctl", *KINDS})
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_TOKEN = 128
_DATA = re.compile(rf"(?:({_NAMESPACE.pattern})\.)?{re.escape(_VERSION)}\.([^.]+)\.({'|'.join(KINDS)})")


def run_token(run_id: str) -> str:
    """``run_id`` as one subject token: only ``[A-Za-z0-9_-]``, never empty or reserved.

    The mapping is lossy on purpose (the envelope carries the real run id); it only
    routes messages.
    """
    token = _UNSAFE.sub("_", run_id)[:_MAX_TOKEN] or "_"
    if token in _RESERVED:
        token = "_" + token
    return token


def describe_namespace(namespace: str) -> str:
    """``namespace`` for a message: ``namespace 'staging'``, or ``the default namespace``."""
    return f"namespace {namespace!r}" if namespace else "the default namespace"


def data_namespace(subject: str) -> str | None:
    """The namespace whose agent data subject ``subject`` is (``""``: the default one); ``None`` when it is
    no namespace's data subject (an alert, a control request, anything else)."""
    found = _DATA.fullmatch(subject)
    if found is None or run_token(found.group(2)) != found.group(2):
        return None
    return found.group(1) or ""


@dataclass(frozen=True, slots=True)
class Subjects:
    """Every subject (and the stream name) of one namespace; ``Subjects()`` is the default namespace's.

    Raises:
        ConfigError: ``namespace`` is not :data:`NAMESPACE_RULE`; the message names the setting and the rule.
    """

    namespace: str = ""

    def __post_init__(self) -> None:
        if self.namespace and not _NAMESPACE.fullmatch(self.namespace):
            shown = self.namespace if len(self.namespace) <= 60 else f"{self.namespace[:40]}..."
            raise ConfigError(
                f"namespace (VIGIL_NAMESPACE, --namespace) must be {NAMESPACE_RULE}, not {shown!r}", key="namespace"
            )

    @property
    def prefix(self) -> str:
        """What every subject of this namespace starts with: ``vigil.v1``, or ``N.vigil.v1``."""
        return f"{self.namespace}.{_VERSION}" if self.namespace else _VERSION

    @property
    def stream_name(self) -> str:
        """The stream of this namespace when ``stream.name`` is left at its default: ``VIGIL`` or ``VIGIL_N``."""
        return f"{STREAM}_{self.namespace}" if self.namespace else STREAM

    def data(self, run_id: str, kind: Kind) -> str:
        """The subject an agent publishes ``kind`` records of ``run_id`` on."""
        return f"{self.prefix}.{run_token(run_id)}.{kind}"

    def data_run(self, subject: str) -> str | None:
        """The run token of an agent data subject of this namespace; ``None`` for any other subject (another
        namespace's, or a token :func:`run_token` never makes, such as ``alerts`` or ``ctl``)."""
        found = _DATA.fullmatch(subject)
        if found is None or (found.group(1) or "") != self.namespace or run_token(found.group(2)) != found.group(2):
            return None
        return found.group(2)

    @property
    def stream_subjects(self) -> list[str]:
        """What an unsharded daemon's stream captures: agent data only, never alerts or control requests."""
        return [f"{self.prefix}.*.{kind}" for kind in KINDS]

    def alert(self, run_id: str) -> str:
        """The subject the daemon publishes anomalies (and canary verdicts) of ``run_id`` on."""
        return f"{self.prefix}.alerts.{run_token(run_id)}"

    @property
    def alerts(self) -> str:
        """Every run's alerts: what ``vigil alerts --follow`` subscribes to."""
        return f"{self.prefix}.alerts.>"

    @property
    def control(self) -> str:
        """Every control request (queries, canary triggers, roll calls): what an agent may never publish."""
        return f"{self.prefix}.ctl.>"

    @property
    def query(self) -> str:
        """Request/reply: a read-only SQL query in, its answer out (``vigil sql``)."""
        return f"{self.prefix}.ctl.sql"

    @property
    def holders(self) -> str:
        """Every daemon answers here who it is and which stream and consumer it holds (under the query subject:
        readers may ask)."""
        return f"{self.query}.daemons"

    @property
    def roll_call(self) -> str:
        """Every sharded daemon answers a request here with its ``[index, count]``."""
        return f"{self.query}.shards"

    def shard_query(self, index: int) -> str:
        """Where shard ``index`` answers read-only SQL."""
        return f"{self.query}.shard.{index}"

    @property
    def canary(self) -> str:
        """Request/reply: a canary trigger in, the daemon's acceptance out (the daemon's credentials)."""
        return f"{self.prefix}.ctl.canary"

    def shard_canary(self, index: int) -> str:
        """Where shard ``index`` takes canary triggers for the runs it owns."""
        return f"{self.canary}.shard.{index}"


DEFAULT_SUBJECTS = Subjects()
"""The default namespace's subjects: those of a deployment that names no namespace."""
