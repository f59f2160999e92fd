"""One table of record types: where each travels, where the daemon keeps it, how it is counted.

Adding a record type means one row here (and its struct in :mod:`.records`): the agent's
batcher reads ``subject`` (which ``vigil.v1.<run>.<kind>`` it goes out on), the daemon's decoder
reads ``field`` (the :class:`~trainvigil.daemon.batch.decode.IngestBatch` list it lands in),
ingest counts it under ``counter`` (``vigil_events_ingested_total{kind=...}``), and ``table``
names the DuckDB table its rows go to.
"""

from __future__ import annotations

from dataclasses import dataclass

from .records import (
    Anomaly,
    CanaryResult,
    CheckpointDigest,
    GilSample,
    Heartbeat,
    RunEnd,
    RunEvent,
    RunStart,
    StepBatch,
)
from .subjects import Kind


@dataclass(frozen=True, slots=True)
class RecordKind:
    subject: Kind
    field: str
    counter: str
    table: str
    sourced: bool = True
    """Kept with the envelope's source as ``(source, record)``; False: the record alone."""


RECORD_KINDS: dict[type, RecordKind] = {
    StepBatch: RecordKind("metrics", "steps", "steps", "steps"),
    RunStart: RecordKind("run", "run_starts", "run", "events"),
    RunEnd: RecordKind("run", "run_ends", "run", "events"),
    RunEvent: RecordKind("run", "events", "run", "events"),
    Heartbeat: RecordKind("hb", "heartbeats", "heartbeat", "heartbeats"),
    GilSample: RecordKind("gil", "gil_samples", "gil", "gil_samples"),
    CheckpointDigest: RecordKind("ckpt", "checkpoints", "ckpt", "checkpoints"),
    Anomaly: RecordKind("run", "anomalies", "anomaly", "anomalies", sourced=False),
    CanaryResult: RecordKind("run", "canaries", "canary", "canary_results", sourced=False),
}
"""Every record type of the wire, by its struct."""

SOURCED_FIELDS: tuple[str, ...] = tuple(
    dict.fromkeys(k.field for t, k in RECORD_KINDS.items() if k.sourced and t is not StepBatch)
)
"""The IngestBatch lists of (source, record) pairs, in table order."""
