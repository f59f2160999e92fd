"""Streaming anomaly detectors (the ingest seam)."""
