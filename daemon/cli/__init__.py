"""The ``vigil`` commands.

Only the standard library and the agent load at start, so the commands that need neither
the daemon extra nor a broker (``verify``, ``push``) run on a training machine.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
