"""trainvigil.daemon: the sidecar that ingests, detects, stores and answers SQL."""
