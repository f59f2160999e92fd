"""The daemon's HTTP side: ``/healthz`` and ``/metrics``."""
