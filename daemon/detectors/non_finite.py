"""``non_finite``: loss, grad_norm, reward or kl NaN/±Inf → page on that same step.

Mixed precision is different: a dynamic loss scaler skips a step whenever the scaled
gradients overflow, and an infinite grad norm on that step is routine. Once a stream
reports ``step_skipped`` or ``loss_scale``, a non-finite grad norm alone does not page;
only ``consecutive_skips`` skipped steps in a row do (the scaler is not recovering).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import NONE, PAGE, DetectorSettings, Finding, StreamDetector
from trainvigil.daemon.detectors._robust import consecutive
from trainvigil.daemon.detectors._series import StreamKey, StreamSteps, streams
from trainvigil.daemon.detectors._settings import NonFiniteSettings
from trainvigil.schemas import Anomaly

_HINT = (
    "inspect the batch and the learning rate at this step, lower the LR or enable gradient clipping, "
    "and resume from the last good checkpoint"
)


class _Stream:
    __slots__ = ("amp", "last_scale", "skips", "watermark")

    def __init__(self) -> None:
        self.watermark: dict[str, int] = {}
        self.amp = False
        self.last_scale = float("nan")
        self.skips = 0


class NonFinite(StreamDetector[_Stream]):
    name: ClassVar[str] = "non_finite"
    Settings: ClassVar[type[DetectorSettings]] = NonFiniteSettings

    def new_state(self) -> _Stream:
        return _Stream()

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        out: list[Anomaly] = []
        suspects = self._suspects(batch)
        for key, steps in streams(batch).items():
            if key in suspects or self.episodes.is_open(key) or self._amp(key, steps):
                out.extend(self._judge(key, steps))
            # Else every value is finite and there is no episode to clear nor loss scaler to follow:
            # nothing to say (most streams of most batches; a busy fleet's batch holds hundreds).
        return out

    def _suspects(self, batch: IngestBatch) -> set[StreamKey]:
        """The streams with a non-finite value in a judged metric (one check for the whole batch when none has)."""
        judged = self.settings.metrics
        columns = [
            (part, column)
            for part in batch.steps
            for name in judged
            if (column := part.known.get(name) or part.custom.get(name)) is not None
        ]
        if not columns or bool(np.isfinite(np.concatenate([values for _, (values, _) in columns])).all()):
            return set()
        return {
            (part.source.run_id, part.source.rank) for part, (values, _) in columns if not np.isfinite(values).all()
        }

    def _amp(self, key: StreamKey, steps: StreamSteps) -> bool:
        state = self._streams.get(key)
        return (state is not None and state.amp) or "step_skipped" in steps.columns or "loss_scale" in steps.columns

    def _judge(self, key: StreamKey, s: StreamSteps) -> list[Anomaly]:
        state = self.state(key)
        fresh = np.zeros(len(s.step), dtype=bool)
        bad = np.zeros(len(s.step), dtype=bool)
        culprit = np.full(len(s.step), -1)
        state.amp = state.amp or "step_skipped" in s.columns or "loss_scale" in s.columns
        for m, name in enumerate(self.settings.metrics):
            column = s.columns.get(name)
            if column is None:
                continue
            values, present = column
            mine = present & (s.step > state.watermark.get(name, -(2**63)))
            if not mine.any():
                continue
            state.watermark[name] = int(s.step[mine][-1])
            fresh |= mine
            if state.amp and name == "grad_norm":
                continue  # judged through skipped steps below
            hit = mine & ~np.isfinite(values)
            culprit[hit & ~bad] = m
            bad |= hit
        skipped_run = self._skipped_runs(state, s) if state.amp else None
        if skipped_run is not None:
            fresh |= skipped_run > 0
            page = skipped_run >= self.settings.consecutive_skips
            bad |= page
        if not fresh.any():
            return []
        at, time = s.step[fresh], s.time[fresh]
        severity = np.where(bad[fresh], PAGE, NONE)
        idx = np.flatnonzero(fresh)

        def describe(i: int) -> Finding:
            j = idx[i]
            if culprit[j] >= 0:
                name = self.settings.metrics[culprit[j]]
                value = float(s.columns[name][0][j])
                return Finding(value, None, None, f"{name} is {value} at step {int(s.step[j])}: {_HINT}")
            run = int(skipped_run[j]) if skipped_run is not None else 0
            return Finding(
                float(run),
                None,
                float(self.settings.consecutive_skips),
                f"{run} consecutive steps skipped by the loss scaler (gradients overflow every step): "
                "the loss scale cannot recover; check for a bad batch or a diverging layer",
            )

        return self.episodes.scan(key, at, severity, time, describe)

    def _skipped_runs(self, state: _Stream, s: StreamSteps) -> np.ndarray:
        """Per step: the length of the run of consecutive skipped steps ending there (0 if not skipped)."""
        skipped = np.zeros(len(s.step), dtype=bool)
        known = np.zeros(len(s.step), dtype=bool)
        if "step_skipped" in s.columns:
            values, present = s.columns["step_skipped"]
            skipped |= present & (values != 0)
            known |= present
        if "loss_scale" in s.columns:
            values, present = s.columns["loss_scale"]
            scale = values[present]
            previous = np.concatenate(([state.last_scale], scale[:-1]))
            dropped = np.zeros(len(s.step), dtype=bool)
            dropped[present] = scale < previous
            skipped |= dropped & ~known
            known |= present
            if len(scale):
                state.last_scale = float(scale[-1])
        runs = np.zeros(len(s.step), dtype=np.int64)
        if known.any():
            run = consecutive(skipped[known], state.skips)
            state.skips = int(run[-1])
            runs[known] = run
        return runs
