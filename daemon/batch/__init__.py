"""One fetched batch: what it holds, decoded from the wire or built from arrays (pure: no broker, no DuckDB)."""

from .decode import DeadLetter, IngestBatch, RawMessage, SeqGap, StepColumns, decode_batch

__all__ = ["DeadLetter", "IngestBatch", "RawMessage", "SeqGap", "StepColumns", "decode_batch"]
