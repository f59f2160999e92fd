"""Shards on the wire: which subjects a shard's stream captures, and the broker mapping that routes runs to shards.

A sharded deployment runs N daemons, each owning the runs whose id hashes to its index. The hash is
computed by the NATS server, not by the agents: a subject mapping in the broker's configuration
rewrites what an agent publishes on ``vigil.v1.<run>.<kind>`` to ``vigil.v1.<P>.<run>.<kind>`` with
``P = {{partition(N,1)}}`` (FNV-1a of the run token, modulo N; nats-server >= 2.8). So:

* agents never know N: the same image and the same ``VIGIL_NATS_URL`` work for 1 or 16 shards, and
  changing N is a broker reload plus new daemons, never a redeploy of every training job;
* every kind of one run (metrics, heartbeats, checkpoints, ...) lands in one partition, so a run's
  ranks all meet the same detectors (stragglers, checkpoint parity);
* each partition is its own stream (``VIGIL-<P>``), so the ingest's exact stream-sequence
  bookkeeping (one contiguous sequence per consumer) holds per shard unchanged, and in a cluster
  each partition's stream has its own RAFT leader: the write load spreads over the NATS nodes.

Without sharding nothing here is used: subjects, stream and consumer are those of one daemon.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .subjects import DEFAULT_SUBJECTS, KINDS, Subjects, run_token

PROBE_KIND = "probe"
"""Not a record kind (no stream captures it): a sharded daemon publishes core messages on
``vigil.v1.<token>.probe`` at start to see the broker's partitioning at work (:func:`partition_of`)."""

_SHARD = re.compile(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*")
_FNV_OFFSET, _FNV_PRIME = 0x811C9DC5, 0x01000193
MAX_SHARDS = 1024


@dataclass(frozen=True, slots=True)
class ShardId:
    """Shard ``index`` of ``count`` (``0/2``, ``1/2``) of the deployment in ``subjects``' namespace (which two
    ShardIds are equal does not depend on it: one deployment's shards are compared)."""

    index: int
    count: int
    subjects: Subjects = field(default=DEFAULT_SUBJECTS, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def stream_subjects(self) -> list[str]:
        """What this shard's stream captures: the mapped subjects of its partition."""
        return partition_subjects(self.index, self.subjects)

    @property
    def query_subject(self) -> str:
        """Where this shard answers read-only SQL (the request/reply of ``vigil sql``)."""
        return self.subjects.shard_query(self.index)

    def owns(self, run_id: str) -> bool:
        """Whether the broker routes ``run_id``'s records to this shard (:func:`shard_of`)."""
        return shard_of(run_id, self.count) == self.index

    def owner_of(self, run_id: str) -> ShardId:
        """The shard of this deployment whose stream holds ``run_id``'s records."""
        return ShardId(shard_of(run_id, self.count), self.count, self.subjects)

    @property
    def canary_subject(self) -> str:
        """Where this shard takes canary triggers for the runs it owns (handed on by whichever shard got one)."""
        return self.subjects.shard_canary(self.index)


def partition_subjects(partition: int | str = "*", subjects: Subjects = DEFAULT_SUBJECTS) -> list[str]:
    """The subjects the broker's mappings put a partition's records on, one per record kind:
    ``vigil.v1.<partition>.<run>.<kind>`` (``"*"``: every partition's)."""
    return [f"{subjects.prefix}.{partition}.*.{kind}" for kind in KINDS]


def probe_subject(token: str, subjects: Subjects = DEFAULT_SUBJECTS) -> str:
    """Where a sharded daemon publishes the start-up probe ``token``: ``vigil.v1.<token>.probe``, which the
    broker's mapping turns into ``vigil.v1.<P>.<token>.probe``."""
    return f"{subjects.prefix}.{token}.{PROBE_KIND}"


def parse_shard(text: str, subjects: Subjects = DEFAULT_SUBJECTS) -> ShardId:
    """``"I/N"`` as a :class:`ShardId` of the deployment in ``subjects``' namespace.

    Raises:
        ValueError: not ``I/N`` with ``0 <= I < N <= MAX_SHARDS``; the message says the form.
    """
    match = _SHARD.fullmatch(text)
    if match is None:
        raise ValueError(f"a shard is INDEX/COUNT like 0/2, not {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if not 0 <= index < count <= MAX_SHARDS:
        raise ValueError(f"a shard INDEX/COUNT needs 0 <= INDEX < COUNT <= {MAX_SHARDS}, not {text!r}")
    return ShardId(index, count, subjects)


def partition_mappings(count: int, subjects: Subjects = DEFAULT_SUBJECTS) -> dict[str, str]:
    """The broker's subject mappings that partition runs over ``count`` shards (source → destination).

    One mapping per record kind (and the start-up probe's), never ``vigil.v1.*.*``: that would also rewrite alerts
    (``vigil.v1.alerts.<run>``) and control requests (``vigil.v1.ctl.sql``). The same mappings must be
    in every NATS node's configuration (``mappings { ... }``, or the account's when it has users); those of
    another namespace (``subjects``) go beside them, since no source subject of one matches another's.
    """
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"shard count must be 1..{MAX_SHARDS}, not {count}")
    kinds = (*KINDS, PROBE_KIND)
    prefix = subjects.prefix
    return {f"{prefix}.*.{kind}": f"{prefix}.{{{{partition({count},1)}}}}.{{{{wildcard(1)}}}}.{kind}" for kind in kinds}


def partition_of(token: str, count: int) -> int:
    """The partition nats-server's ``{{partition(count,1)}}`` gives the run token ``token``.

    FNV-1a (32 bit) of the token's bytes, modulo ``count``: the server's own rule, so a client can
    tell which shard holds a run without asking (tests pin it against a real server).
    """
    h = _FNV_OFFSET
    for byte in token.encode():
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h % count


def shard_of(run_id: str, count: int) -> int:
    """The shard (of ``count``) whose stream holds ``run_id``'s records: the partition of its subject token."""
    return partition_of(run_token(run_id), count)
