"""The wire records: frozen msgspec Structs in one tagged union.

Every NATS message is one :class:`Envelope` holding many records (an agent sends one
message per flush). Step metrics travel columnar in :class:`StepBatch`: one packed
little-endian array per field over many steps, which lets the daemon ingest with
``numpy.frombuffer`` instead of a Python loop per event.

Compatibility rules: new fields always get defaults; readers ignore fields they do not
know; the envelope's ``v`` is the major version and a reader rejects any other major.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .limits import Count32, Count64, Frames, Int32, Int64, Name, Rank, Text, Time

SCHEMA_MAJOR = 1
SCHEMA_MINOR = 3

KNOWN_METRICS: tuple[str, ...] = (
    "loss",
    "grad_norm",
    "lr",
    "step_time",
    "samples",
    "tokens",
    "reward",
    "entropy",
    "kl",
)
"""Metric names that get their own column in the ``steps`` table; any other name is custom."""


class _Record(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    """Base of every record: ``time`` is Unix seconds when the producer made it."""

    time: Time


class Source(msgspec.Struct, frozen=True, kw_only=True):
    """Who produced an envelope: one agent process (one rank of one run)."""

    run_id: Name
    rank: Rank = 0
    world_size: Count32 = 1
    local_rank: Count32 = 0
    host: Name = ""
    pid: Int32 = 0


class Column(msgspec.Struct, frozen=True, kw_only=True):
    """One metric over the steps of a batch.

    ``values`` holds float64 little-endian numbers, one per step. ``present`` holds one
    byte per step (1 = logged at that step, 0 = not logged, stored as NULL); empty means
    every step has a value. NaN and infinities are real values, never markers of absence.
    """

    values: bytes
    present: bytes = b""


class StepBatch(_Record, frozen=True, tag="steps"):
    """Many ``log()`` calls, columnar.

    ``step`` holds int64 LE step numbers, ``times`` float64 LE Unix seconds of each
    ``log()`` call; every column in ``columns`` has the same length as ``step``.
    """

    step: bytes
    times: bytes
    columns: dict[Name, Column] = {}


class RunStart(_Record, frozen=True, tag="run_start"):
    """An agent started: the run's configuration as the producer saw it."""

    argv: list[Text] = []
    config: dict[str, Any] = {}
    agent_version: Name = ""


class RunEnd(_Record, frozen=True, tag="run_end"):
    """An agent closed cleanly (``status`` ``ok``) or on an exception (``error``; ``error``
    holds ``Type: message`` of an uncaught one, minor 2)."""

    status: Name = "ok"
    error: Text = ""
    last_step: Int64 | None = None
    dropped: dict[Name, Count64] = {}


class RunEvent(_Record, frozen=True, tag="event"):
    """A run-level event from ``agent.event(kind, **fields)``."""

    kind: Name
    step: Int64 | None = None
    fields: dict[str, Any] = {}
    """JSON-like values, nested at most ``limits.MAX_FIELDS_DEPTH`` deep."""


class Heartbeat(_Record, frozen=True, tag="heartbeat"):
    """Liveness and agent health, every few seconds.

    ``dropped`` counts events lost, by reason, since the agent started.
    """

    last_step: Int64 | None = None
    buffered: Count64 = 0
    spilled_bytes: Count64 = 0
    connected: bool = True
    dropped: dict[Name, Count64] = {}
    stack: Frames = []
    """Innermost-last frames (``file:line function``) of the training thread, sent only while no
    step has completed for a while: where a hung loop is stuck (minor 2)."""


class ThreadShare(msgspec.Struct, frozen=True, kw_only=True):
    """One thread's part of the GIL-held time in a :class:`GilSample` period."""

    name: str
    tid: int = 0
    share: float = 0.0
    state: str = ""
    top_functions: list[str] = []


class GilSample(_Record, frozen=True, tag="gil"):
    """GIL contention over one sampling period (wait percentiles in seconds)."""

    period: float
    samples: Count32
    wait_p50: float
    wait_p90: float
    wait_p99: float
    wait_max: float
    busy_share: float
    wait_share: float
    held: float
    switch_interval: float
    gil_enabled: bool = True
    threads: list[ThreadShare] = []


class CheckpointDigest(_Record, frozen=True, tag="ckpt"):
    """Digests of a state dict: one per tensor and a root over all of them.

    ``origin`` says why it was computed: ``save``, ``load`` or ``parity``.
    """

    step: Int64 | None
    algo: Name
    root: Text
    tensors: dict[Text, Text] = {}
    path: Text = ""
    origin: Literal["save", "load", "parity"] = "save"
    ok: bool = True


class Anomaly(_Record, frozen=True, tag="anomaly"):
    """One alert episode's state: ``state`` is ``open``, ``escalated``, ``degraded`` (its flags
    stopped but the metric did not return to its level before the incident) or ``cleared``."""

    run_id: Name
    rank: Rank
    step: Int64 | None
    detector: Name
    severity: Literal["warn", "page"]
    value: float | None = None
    baseline: float | None = None
    threshold: float | None = None
    message: Text = ""
    state: Name = "open"
    episode: Name = ""
    """Shared by every update of one incident (open, escalated, degraded, cleared)."""
    last_step: Int64 | None = None
    """The latest step that was flagged in this episode."""


class CanaryResult(_Record, frozen=True, tag="canary"):
    """The verdict of one fault-injection canary job (the daemon's ``canary_results`` row).

    ``name`` is the canary's run id (``canary-<id>``), ``fault`` a ``VIGIL_FAULT`` kind or ``none``
    (a clean twin), ``fault_step`` the step the fault was injected at. ``verdict`` (minor 3) is
    ``pass``, ``fail`` (the detector missed, was late, or another one paged; a clean twin raised
    an alert), ``error`` (the job crashed, timed out, or never injected its fault) or ``aborted``
    (the daemon stopped first); ``passed`` is ``verdict == "pass"``. Latencies run from the
    injection to the expected detector's episode; ``duration_s`` is the job's wall time.
    """

    name: Name
    fault: Name
    passed: bool
    expected_detector: Name = ""
    fault_step: Int64 | None = None
    fired_step: Int64 | None = None
    latency_steps: Int64 | None = None
    detail: Text = ""
    workload: Name = ""
    verdict: Literal["", "pass", "fail", "error", "aborted"] = ""
    """Empty from a producer older than minor 3: read ``passed``."""
    fired_detector: Name = ""
    latency_s: float | None = None
    exit_code: Int32 | None = None
    duration_s: float | None = None


Record = StepBatch | RunStart | RunEnd | RunEvent | Heartbeat | GilSample | CheckpointDigest | Anomaly | CanaryResult
RECORD_TYPES: tuple[type[msgspec.Struct], ...] = (
    StepBatch,
    RunStart,
    RunEnd,
    RunEvent,
    Heartbeat,
    GilSample,
    CheckpointDigest,
    Anomaly,
    CanaryResult,
)


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """One NATS message: the schema version, who sent it, and the records it carries.

    ``seq`` counts the producer's messages from 1; together with ``source`` it names a
    message uniquely (it becomes the JetStream ``Nats-Msg-Id`` for de-duplication).
    """

    v: int = SCHEMA_MAJOR
    minor: int = SCHEMA_MINOR
    source: Source
    seq: int = 0
    records: list[Record] = []
