"""The one exception tree of trainvigil: everything raised on purpose is a VigilError."""

from __future__ import annotations


class VigilError(Exception):
    """Root of every error trainvigil raises on purpose."""


class ConfigError(VigilError, ValueError):
    """A configuration value is missing or invalid; the message names the key."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class WireError(VigilError, ValueError):
    """A message on the wire cannot be read; ``reason`` is a short machine-readable tag."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SchemaVersionError(WireError):
    """A message carries a schema major version this reader does not speak."""

    def __init__(self, got: object, expected: int) -> None:
        super().__init__(
            f"schema major version {got!r} is not supported (this reader speaks v{expected}); "
            "upgrade the reader or send v{expected} messages".replace("{expected}", str(expected)),
            reason="schema_version",
        )
        self.got = got
        self.expected = expected


class QueryRefusedError(VigilError):
    """A SQL query was refused: only read-only queries without file or network access run."""


class QueryError(VigilError):
    """A read-only SQL query failed while running (bad SQL, timeout, no such table)."""


class DaemonUnavailableError(VigilError):
    """No running daemon answered and no data directory could be opened instead."""
