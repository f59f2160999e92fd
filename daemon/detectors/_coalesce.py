"""Small step chunks held back from the per-step detectors while batches hold many streams.

A detector's cost is per stream and per batch far more than per step: judging 4 fresh steps
of a stream costs about what judging 256 does (a few dozen NumPy calls either way). A fleet
of thousands of ranks sends one small message per rank per second (the agent's interval
flush), so each batch holds hundreds of streams of a few steps each, and the per-step
detectors alone cost ~0.2 ms per message: the daemon falls behind at ~1 700 messages/s.

So while a batch holds more than ``min_streams`` streams, the detectors that judge steps only
(``coalesce = True``: their episodes depend on the sequence of values, never on how it was
batched, which the replay tests check) get a stream's steps once ``steps`` of them are
waiting, or the oldest waited ``wait_s`` seconds, or its run ended. As soon as a batch is not
busy, every held step goes. ``non_finite`` and the silence watchers (``stall``, ``hang``,
``run_failed``) see every batch as it comes: a NaN still pages with the batch that carried it.
Replay (no clock) holds nothing.

The steps are stored with their own batch whatever happens here: only the judging waits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainvigil.daemon.batch.decode import IngestBatch, StepColumns
from trainvigil.daemon.detectors._series import StreamKey, grouped
from trainvigil.schemas import RunEvent, Source


@dataclass(slots=True)
class _Held:
    parts: list[StepColumns]
    pauses: list[tuple[Source, RunEvent]]
    steps: int
    since: float


class Coalescer:
    """The held steps of each stream, and the batch the per-step detectors see."""

    def __init__(self, min_streams: int, steps: int, wait_s: float) -> None:
        self.min_streams = min_streams
        self.steps = steps
        self.wait_s = wait_s
        self._held: dict[StreamKey, _Held] = {}

    def __len__(self) -> int:
        """Streams with steps held back."""
        return len(self._held)

    def view(self, batch: IngestBatch) -> IngestBatch:
        """What the coalescing detectors judge of ``batch``: ``batch`` itself when nothing is held,
        else a batch of the due streams' steps (held ones first) and the batch's other records."""
        now = batch.now
        current = grouped(batch)
        busy = now is not None and len(current) > self.min_streams
        if not busy and not self._held:
            return batch
        ending = {source.run_id for source, _ in batch.run_ends}
        held = self._held
        steps: list[StepColumns] = []
        events: list[tuple[Source, RunEvent]] = []
        kept = released = False
        for key, (parts, pauses) in current.items():
            waiting = held.get(key)
            fresh = sum(len(p) for p in parts)
            if (
                not busy
                or key[0] in ending
                or fresh + (waiting.steps if waiting else 0) >= self.steps
                or (waiting is not None and now - waiting.since >= self.wait_s)  # type: ignore[operator]
            ):
                released |= self._release(key, steps, events)
                steps.extend(parts)
            elif waiting is None:
                held[key] = _Held(list(parts), list(pauses), fresh, now)  # type: ignore[arg-type]
                kept = True
            else:
                waiting.parts.extend(parts)
                waiting.pauses.extend(pauses)
                waiting.steps += fresh
                kept = True
        # Held streams the batch did not touch: their wait ran out (the dict keeps the order in
        # which holds began, so the oldest come first), their run ended, or the rush is over.
        gone = [key for key in held if key[0] in ending] if ending else []
        for key, waiting in held.items():
            if busy and now - waiting.since < self.wait_s:  # type: ignore[operator]
                break
            gone.append(key)
        for key in gone:
            released |= self._release(key, steps, events)
        if not kept and not released:
            return batch  # nothing held back and nothing released: the batch as it is
        return dataclasses.replace(batch, steps=steps, events=[*events, *batch.events], cache={})

    def _release(self, key: StreamKey, steps: list[StepColumns], events: list[tuple[Source, RunEvent]]) -> bool:
        """Hand ``key``'s held steps (and their pause events) to the batch being built; False if none were held."""
        waiting = self._held.pop(key, None)
        if waiting is None:
            return False
        steps.extend(waiting.parts)
        events.extend(waiting.pauses)
        return True
