"""structlog set-up: JSON lines in production, readable output on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


class _StdlibHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler :func:`configure` installs (so a second call replaces it, not adds one)."""


def configure(fmt: str = "auto", level: str = "info") -> None:
    """Configure structlog, and route stdlib logging (e.g. nats-py's) through the same renderer.

    Args:
        fmt: ``auto`` (JSON unless stderr is a terminal), ``json`` or ``console``.
        level: the lowest level logged; stdlib loggers log ``warning`` and above whatever it is
            (nats-py's info lines are noise here).
    """
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    # ConsoleRenderer formats exceptions itself (and warns when format_exc_info ran first).
    final: list[structlog.typing.Processor] = (
        [structlog.dev.ConsoleRenderer()]
        if use_console
        else [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    numeric = getattr(logging, level.upper(), logging.INFO)
    structlog.configure(
        processors=[*shared, *final],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = _StdlibHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(numeric, logging.WARNING))
