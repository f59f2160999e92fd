"""The wire contract: codec round trips, version and garbage handling, subjects, JSON Schema files."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import msgspec
import numpy as np
import pytest

from trainvigil.errors import SchemaVersionError, WireError
from trainvigil.schemas import (
    DEFAULT_SUBJECTS,
    KINDS,
    RECORD_TYPES,
    SCHEMA_MAJOR,
    Anomaly,
    CanaryResult,
    CheckpointDigest,
    Column,
    Envelope,
    GilSample,
    Heartbeat,
    Record,
    RunEnd,
    RunEvent,
    RunStart,
    Source,
    StepBatch,
    ThreadShare,
    decode,
    encode,
    run_token,
)
from trainvigil.schemas.jsonschema import SCHEMA_DIR, render, schemas

SOURCE = Source(run_id="run-1", rank=3, world_size=8, local_rank=1, host="node-a", pid=4242)

SAMPLES: list[Record] = [
    StepBatch(
        time=1.5,
        step=np.arange(4, dtype="<i8").tobytes(),
        times=np.linspace(10.0, 11.0, 4, dtype="<f8").tobytes(),
        columns={
            "loss": Column(values=np.array([1.0, np.nan, np.inf, 0.5], dtype="<f8").tobytes()),
            "custom": Column(values=np.zeros(4, dtype="<f8").tobytes(), present=bytes([1, 0, 0, 1])),
        },
    ),
    RunStart(time=1.0, argv=["train.py", "--lr", "3e-4"], config={"lr": 3e-4, "layers": [1, 2]}, agent_version="0.1"),
    RunEnd(time=2.0, status="error", last_step=99, dropped={"queue_full": 3}),
    RunEvent(time=3.0, kind="eval", step=10, fields={"acc": 0.9, "split": "val"}),
    Heartbeat(time=4.0, last_step=5, buffered=7, spilled_bytes=100, connected=False, dropped={"spill_full": 1}),
    GilSample(
        time=5.0,
        period=1.0,
        samples=100,
        wait_p50=0.001,
        wait_p90=0.002,
        wait_p99=0.005,
        wait_max=0.01,
        busy_share=0.7,
        wait_share=0.2,
        held=0.8,
        switch_interval=0.005,
        threads=[ThreadShare(name="MainThread", tid=1, share=0.6, state="running", top_functions=["f", "g"])],
    ),
    CheckpointDigest(time=6.0, step=100, algo="xxh3", root="abc", tensors={"w": "def"}, path="/ckpt", origin="load"),
    Anomaly(
        time=7.0,
        run_id="run-1",
        rank=0,
        step=50,
        detector="nan_loss",
        severity="page",
        value=float("inf"),
        baseline=1.0,
        threshold=3.0,
        message="loss is inf",
        state="escalated",
    ),
    CanaryResult(
        time=8.0,
        name="nan-canary",
        fault="nan_loss",
        passed=True,
        expected_detector="nan_loss",
        fault_step=10,
        fired_step=11,
        latency_steps=1,
        detail="ok",
    ),
]


def _builtins(envelope: Envelope) -> dict:
    """The envelope as plain dicts, as a non-Python producer would build it (bytes stay bytes)."""
    return msgspec.to_builtins(envelope, builtin_types=(bytes,))


def test_samples_cover_every_record_type() -> None:
    assert {type(r) for r in SAMPLES} == set(RECORD_TYPES)


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_envelope_round_trip_preserves_each_record_type(record: Record) -> None:
    envelope = Envelope(source=SOURCE, seq=17, records=[record])
    decoded = decode(encode(envelope))
    # NaN != NaN, so compare the wire bytes as well as the structs where it matters.
    assert encode(decoded) == encode(envelope)
    assert type(decoded.records[0]) is type(record)
    assert decoded.source == SOURCE
    assert decoded.seq == 17
    assert decoded.v == SCHEMA_MAJOR


def test_envelope_round_trip_with_all_record_types_keeps_order() -> None:
    envelope = Envelope(source=SOURCE, seq=1, records=list(SAMPLES))
    decoded = decode(encode(envelope))
    assert [type(r) for r in decoded.records] == [type(r) for r in SAMPLES]
    assert encode(decoded) == encode(envelope)


def test_decode_accepts_memoryview() -> None:
    data = encode(Envelope(source=SOURCE, records=[SAMPLES[1]]))
    assert decode(memoryview(data)).records == [SAMPLES[1]]


def test_wrong_major_version_raises_schema_version_error_naming_the_version() -> None:
    raw = _builtins(Envelope(source=SOURCE, records=[SAMPLES[1]]))
    raw["v"] = 2
    with pytest.raises(SchemaVersionError, match=r"\b2\b") as info:
        decode(msgspec.msgpack.encode(raw))
    assert info.value.got == 2
    assert info.value.expected == SCHEMA_MAJOR
    assert info.value.reason == "schema_version"
    assert "v1" in str(info.value)
    assert isinstance(info.value, WireError)


def test_missing_version_is_a_schema_version_error() -> None:
    raw = _builtins(Envelope(source=SOURCE))
    del raw["v"]
    with pytest.raises(SchemaVersionError, match="None"):
        decode(msgspec.msgpack.encode(raw))


def test_newer_minor_version_is_accepted() -> None:
    raw = _builtins(Envelope(source=SOURCE, records=[SAMPLES[2]]))
    raw["minor"] = 99
    assert decode(msgspec.msgpack.encode(raw)).minor == 99


def test_unknown_fields_in_envelope_source_and_record_are_ignored() -> None:
    raw = _builtins(Envelope(source=SOURCE, seq=5, records=[SAMPLES[2], SAMPLES[0]]))
    raw["future_envelope_field"] = {"nested": [1, 2, 3]}
    raw["source"]["gpu_model"] = "H100"
    raw["records"][0]["future_record_field"] = "x"
    raw["records"][1]["compression"] = None
    raw["records"][1]["columns"]["loss"]["encoding"] = "raw"
    decoded = decode(msgspec.msgpack.encode(raw))
    assert decoded.source == SOURCE
    assert decoded.seq == 5
    assert decoded.records[0] == SAMPLES[2]
    # encode() takes an Envelope but serializes any struct: compare the record's own bytes (NaN != NaN).
    assert encode(decoded.records[1]) == encode(SAMPLES[0])  # type: ignore[arg-type]


def test_unknown_record_type_tag_raises_wire_error_invalid() -> None:
    raw = _builtins(Envelope(source=SOURCE, records=[SAMPLES[2]]))
    raw["records"][0]["type"] = "from_the_future"
    with pytest.raises(WireError) as info:
        decode(msgspec.msgpack.encode(raw))
    assert info.value.reason == "invalid"


def test_record_missing_required_field_raises_wire_error_invalid() -> None:
    raw = _builtins(Envelope(source=SOURCE, records=[SAMPLES[3]]))
    del raw["records"][0]["kind"]
    with pytest.raises(WireError, match="kind") as info:
        decode(msgspec.msgpack.encode(raw))
    assert info.value.reason == "invalid"


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"not msgpack at all", b"\xff\xfe\xfd", bytes(range(256))],
    ids=["empty", "never-used-byte", "text", "junk", "all-bytes"],
)
def test_garbage_bytes_raise_wire_error_malformed(data: bytes) -> None:
    with pytest.raises(WireError) as info:
        decode(data)
    assert info.value.reason == "malformed"
    assert not isinstance(info.value, SchemaVersionError)


@pytest.mark.parametrize("data", [msgspec.msgpack.encode(x) for x in (1, "s", [1, 2], None, 3.5)])
def test_msgpack_that_is_not_a_map_raises_wire_error_malformed(data: bytes) -> None:
    with pytest.raises(WireError) as info:
        decode(data)
    assert info.value.reason == "malformed"


def test_every_truncation_of_a_valid_message_raises_wire_error() -> None:
    data = encode(Envelope(source=SOURCE, seq=9, records=list(SAMPLES)))
    reasons = set()
    for cut in range(len(data)):
        with pytest.raises(WireError) as info:
            decode(data[:cut])
        reasons.add(info.value.reason)
    assert reasons <= {"malformed", "invalid", "schema_version"}
    assert "malformed" in reasons


def test_wrong_field_type_raises_wire_error_invalid() -> None:
    raw = _builtins(Envelope(source=SOURCE, records=[SAMPLES[4]]))
    raw["records"][0]["buffered"] = "seven"
    with pytest.raises(WireError, match="buffered") as info:
        decode(msgspec.msgpack.encode(raw))
    assert info.value.reason == "invalid"


# ---- subjects ------------------------------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_RESERVED = {"alerts", "ctl", *KINDS}


@pytest.mark.parametrize(
    "run_id",
    [
        "a.b.c",
        "my run",
        "run>",
        ">",
        "*",
        "a*b",
        "",
        " ",
        "alerts",
        "ctl",
        "metrics",
        "gil",
        "ckpt",
        "run",
        "hb",
        "ünïcode-рун",
        "tab\there",
        "new\nline",
        "x" * 1000,
        "$SYS",
        "a/b\\c",
    ],
)
def test_run_token_is_one_safe_non_reserved_subject_token(run_id: str) -> None:
    token = run_token(run_id)
    assert _TOKEN.fullmatch(token), token
    assert token not in _RESERVED
    assert len(token) <= 129


def test_run_token_keeps_safe_ids_unchanged() -> None:
    assert run_token("torchrun-abc_123") == "torchrun-abc_123"


def test_run_token_replaces_each_unsafe_character_with_underscore() -> None:
    assert run_token("a.b c>d*e") == "a_b_c_d_e"


def test_run_token_of_reserved_words_is_prefixed() -> None:
    assert run_token("alerts") == "_alerts"
    assert run_token("ctl") == "_ctl"
    assert run_token("metrics") == "_metrics"


def test_run_token_of_empty_string_is_underscore() -> None:
    assert run_token("") == "_"


def test_data_subject_shape() -> None:
    assert DEFAULT_SUBJECTS.data("run-1", "metrics") == f"{DEFAULT_SUBJECTS.prefix}.run-1.metrics"
    assert DEFAULT_SUBJECTS.data("a.b", "hb") == "vigil.v1.a_b.hb"
    for kind in KINDS:
        parts = DEFAULT_SUBJECTS.data("x y", kind).split(".")  # type: ignore[arg-type]
        assert parts == ["vigil", f"v{SCHEMA_MAJOR}", "x_y", kind]


def test_alert_subject_shape() -> None:
    assert DEFAULT_SUBJECTS.alert("run-1") == "vigil.v1.alerts.run-1"
    assert DEFAULT_SUBJECTS.alert("ctl").split(".") == ["vigil", "v1", "alerts", "_ctl"]


def test_data_subject_of_reserved_run_never_collides_with_control_or_alerts() -> None:
    assert DEFAULT_SUBJECTS.data("ctl", "metrics") != DEFAULT_SUBJECTS.query
    assert DEFAULT_SUBJECTS.data("ctl", "metrics").split(".")[2] != "ctl"
    assert DEFAULT_SUBJECTS.data("alerts", "run").split(".")[2] != "alerts"


# ---- JSON Schema -----------------------------------------------------------------------------


def test_json_schema_directory_holds_exactly_the_rendered_files() -> None:
    rendered = schemas()
    on_disk = {p.name for p in SCHEMA_DIR.glob("*.json")}
    assert on_disk == set(rendered)


@pytest.mark.parametrize("name", sorted(schemas()))
def test_json_schema_file_equals_what_the_structs_render(name: str) -> None:
    assert (SCHEMA_DIR / name).read_text() == render(schemas()[name]), (
        f"{name} drifted; regenerate with python -m trainvigil.schemas.jsonschema"
    )


def test_render_is_stable_sorted_json_with_trailing_newline() -> None:
    text = render({"b": 1, "a": {"d": 2, "c": 3}})
    assert text.endswith("}\n")
    assert json.loads(text) == {"a": {"c": 3, "d": 2}, "b": 1}
    assert text.index('"a"') < text.index('"b"')


def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMA_DIR / name).read_text())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def _as_json(value: object) -> Any:
    # JSON has no bytes: msgspec writes them as base64 strings, as the schema documents.
    return json.loads(msgspec.json.encode(msgspec.to_builtins(value)))


def test_encoded_envelope_validates_against_envelope_json_schema() -> None:
    envelope = decode(encode(Envelope(source=SOURCE, seq=3, records=list(SAMPLES))))
    as_json = _as_json(envelope)
    assert isinstance(as_json["records"][0]["step"], str)  # base64
    _validator("envelope.schema.json").validate(as_json)


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_each_record_validates_against_its_own_json_schema(record: msgspec.Struct) -> None:
    tag = type(record).__struct_config__.tag
    _validator(f"{tag}.schema.json").validate(_as_json(record))


def test_envelope_json_schema_rejects_a_record_without_its_required_fields() -> None:
    as_json = _as_json(Envelope(source=SOURCE, records=[SAMPLES[3]]))
    del as_json["records"][0]["kind"]
    with pytest.raises(jsonschema.ValidationError):
        _validator("envelope.schema.json").validate(as_json)
