"""Encode and decode envelopes; encoders and decoders are built once and reused."""

from __future__ import annotations

import msgspec

from trainvigil.errors import SchemaVersionError, WireError

from .limits import MAX_FIELDS_DEPTH, fields_depth
from .records import SCHEMA_MAJOR, Envelope, RunEvent, RunStart


class _Header(msgspec.Struct):
    """Just enough of an envelope to check its version before decoding the rest."""

    v: object = None


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(_Header)
_envelope_decoder = msgspec.msgpack.Decoder(Envelope)


def encode(envelope: Envelope) -> bytes:
    """MessagePack bytes of ``envelope``."""
    return _encoder.encode(envelope)


def decode(data: bytes | memoryview) -> Envelope:
    """Decode one message, checking the major version first.

    Raises:
        SchemaVersionError: the envelope's ``v`` is not this reader's major version.
        WireError: the bytes are not a well-formed envelope (``reason`` says how).
    """
    try:
        header = _header_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise WireError(f"not a MessagePack envelope: {exc}", reason="malformed") from exc
    except msgspec.ValidationError as exc:
        raise WireError(f"not an envelope: {exc}", reason="malformed") from exc
    except RecursionError as exc:
        raise WireError("values nested too deep to decode", reason="too_deep") from exc
    if header.v != SCHEMA_MAJOR:
        raise SchemaVersionError(header.v, SCHEMA_MAJOR)
    try:
        envelope = _envelope_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise WireError(f"envelope does not match schema v{SCHEMA_MAJOR}: {exc}", reason="invalid") from exc
    except msgspec.DecodeError as exc:
        raise WireError(f"truncated or corrupt MessagePack: {exc}", reason="malformed") from exc
    except RecursionError as exc:
        raise WireError("values nested too deep to decode", reason="too_deep") from exc
    _check_depth(envelope)
    return envelope


def _check_depth(envelope: Envelope) -> None:
    for record in envelope.records:
        if isinstance(record, RunEvent | RunStart):
            value = record.fields if isinstance(record, RunEvent) else record.config
            if fields_depth(value) > MAX_FIELDS_DEPTH:
                raise WireError(
                    f"{record.__struct_config__.tag} values nested deeper than {MAX_FIELDS_DEPTH} levels",
                    reason="too_deep",
                )
