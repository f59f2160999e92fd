"""The one exception tree of trainvigil: everything raised on purpose is a VigilError."""

from __future__ import annotations

from typing import ClassVar

EXIT_OK, EXIT_QUERY, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_TRUNCATED, EXIT_PARTIAL = 0, 1, 2, 3, 4, 5
"""The exit codes of ``vigil``, the same for every command; what each means: ``daemon/cli/_exits.py``. Here, at
the bottom of the package, so the error classes of every side (the agent's ``vigil push`` included) carry theirs."""


class VigilError(Exception):
    """Root of every error trainvigil raises on purpose.

    A class meant to end a ``vigil`` command sets ``exit_code`` (the command exits with it after one line on
    stderr, ``vigil: `` then ``cli_prefix`` then the message); ``None``: not a command's failure, shown as a bug.
    """

    exit_code: ClassVar[int | None] = None
    cli_prefix: ClassVar[str] = ""


class ConfigError(VigilError, ValueError):
    """A configuration value is missing or invalid; the message names the key."""

    exit_code = EXIT_USAGE
    cli_prefix = "configuration error: "

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

    exit_code = EXIT_QUERY
    cli_prefix = "refused: "


class QueryError(VigilError):
    """A read-only SQL query failed while running (bad SQL, timeout, no such table)."""

    exit_code = EXIT_QUERY
    cli_prefix = "query failed: "


class QueryBusyError(QueryError):
    """The daemon (or a shard) ran nothing: every ``query_concurrency`` slot was taken."""


class StoreUnavailableError(VigilError):
    """The daemon's database cannot write (disk full, out of memory, I/O error); the batch was
    not committed. ``cause`` is ``disk_full``, ``out_of_memory`` or ``io_error``."""

    _ADVICE = {
        "disk_full": "free disk space (or fix the data directory)",
        "out_of_memory": "a query or the store needs more than store.memory_limit_bytes; it frees by itself",
        "io_error": "fix the data directory",
    }

    def __init__(self, path: str, detail: str, cause: str = "io_error") -> None:
        advice = self._ADVICE.get(cause, self._ADVICE["io_error"])
        super().__init__(f"cannot write to {path}: {detail}; {advice}, and the daemon resumes by itself")
        self.path = path
        self.detail = detail
        self.cause = cause


class BatchUnstorableError(VigilError):
    """The database refused a batch for what it holds (a value that does not fit its column), not for want
    of memory or disk: nothing of it was committed. ``detail`` is the database's error; ingest splits the
    batch by message and dead-letters the ones at fault (``daemon/ingest/isolate.py``)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path} refused a batch: {detail}; split it to find the messages at fault")
        self.path = path
        self.detail = detail


class DaemonUnavailableError(VigilError):
    """No running daemon answered and no data directory could be opened instead."""

    exit_code = EXIT_UNAVAILABLE


class CheckpointIntegrityError(VigilError):
    """A checkpoint's content does not match the digests in its manifest.

    ``differing`` names the leaves (tensors or values) whose digests differ or that only
    one side has.
    """

    def __init__(self, path: str, differing: list[str], detail: str = "") -> None:
        shown = ", ".join(differing[:10]) + (f" (+{len(differing) - 10} more)" if len(differing) > 10 else "")
        super().__init__(
            f"checkpoint {path} does not match its manifest: {shown or detail}; "
            "the file is corrupt or was changed after saving: restore it from another copy or an earlier checkpoint"
        )
        self.path = path
        self.differing = differing


class ManifestMissingError(VigilError, FileNotFoundError):
    """A checkpoint has no ``<path>.vigil.json`` manifest (or it cannot be read)."""


class ReplayError(VigilError, ValueError):
    """A recording cannot be replayed (missing file, unknown format, bad columns); the message says why."""

    exit_code = EXIT_USAGE
    cli_prefix = "cannot replay: "
