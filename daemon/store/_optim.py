"""``optim_results`` rows from the ``optim_result`` events ``vigil bench-optim`` publishes (pure).

The event is stored in ``events`` like any other; this makes its row of ``optim_results`` in the
same transaction. An event whose fields do not read as an :class:`OptimResult` makes no row (it
stays in ``events``, and the log says why).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog

from trainvigil.schemas import RunEvent, Source
from trainvigil.schemas.optim import OPTIM_RESULT_EVENT, OptimResult

log = structlog.get_logger("trainvigil.store")

_FIELDS = tuple(f for f in OptimResult.__struct_fields__ if f != "run_id" and f != "bench_id")
COLUMNS = ("time", "bench_id", "run_id", *_FIELDS)
"""The table's columns in order (``schema.sql`` creates them so)."""


def optim_rows(events: list[tuple[Source, RunEvent]]) -> list[tuple[Any, ...]]:
    """One row per ``optim_result`` event, in ``COLUMNS`` order; ``bench_id`` defaults to the publishing run."""
    rows = []
    for source, event in events:
        if event.kind != OPTIM_RESULT_EVENT:
            continue
        try:
            result = msgspec.convert(event.fields, OptimResult)
        except msgspec.ValidationError as error:
            log.warning("optim_result_unreadable", run_id=source.run_id, error=str(error))
            continue
        when = datetime.fromtimestamp(event.time, tz=UTC)
        rows.append((when, result.bench_id or source.run_id, result.run_id, *(getattr(result, f) for f in _FIELDS)))
    return rows
