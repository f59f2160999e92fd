"""Alert updates out: NATS, the log, counters and the webhook sink; their one-line text."""

from .fanout import Alerts

__all__ = ["Alerts"]
