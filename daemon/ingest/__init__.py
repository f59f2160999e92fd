"""The ingest stage: fetch in stream order, decode, run the detectors, commit, ack."""

from .pipeline import Ingest

__all__ = ["Ingest"]
