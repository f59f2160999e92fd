"""``generalisation``: the validation loss rises while the training loss falls.

A model that memorises (the same batch repeated, leaked or duplicated data, a loader stuck on
one shard) or trains past its best point keeps lowering its training loss while its
validation loss climbs. No step-level detector sees it: every training step looks healthy.
This one compares the two curves at each evaluation.

Inputs: a validation metric logged at evaluation steps (``val_loss`` by default, or any of
``metrics``, or the name a run declares as ``trainvigil.init(config={"val_metric": ...})``),
also accepted as a field of an ``eval`` event; and the training ``loss``, summarised per
evaluation interval by its median (robust to single spikes).

At each evaluation, with ``best`` the lowest validation value so far:

* **page** (sudden): the validation value rose from the previous evaluation to at least
  ``page_ratio`` x ``best`` while the training median did not rise, or rose to
  ``warn_ratio`` x ``best`` while the training median collapsed (fell ``collapse`` x or
  more in one interval): memorisation, seen at the first evaluation after it starts;
* **page** (gradual): ``rises`` consecutive rises ending ``page_drift`` x above ``best``
  while the training median kept falling: overfitting, well under way;
* **warn**: ``rises`` consecutive rises ending ``warn_ratio`` x above ``best`` while the
  training median kept falling: overfitting begins; stop at the best checkpoint.

Nothing is judged before ``min_evals`` evaluations (early evaluations are noisy and the first
ones set ``best``). The episode clears once the validation value is back within
``warn_ratio`` of ``best``. Rises smaller than ``tolerance`` (relative) are noise, not rises.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import NONE, PAGE, WARN, DetectorSettings, Finding, StreamDetector
from trainvigil.daemon.detectors._declared import Declared, a_name
from trainvigil.daemon.detectors._series import StreamKey, streams
from trainvigil.daemon.detectors._settings import GeneralisationSettings
from trainvigil.schemas import Anomaly

_TRAIN_WINDOW = 1024
"""Training-loss values kept per evaluation interval (the median's sample)."""


class _Stream:
    __slots__ = ("best", "best_step", "evals", "judged", "last_eval", "train", "train_meds")

    def __init__(self) -> None:
        self.evals: deque[tuple[int, float]] = deque(maxlen=16)
        self.train_meds: deque[float] = deque(maxlen=16)
        """Median training loss of each evaluation interval, aligned with ``evals``."""
        self.train: deque[float] = deque(maxlen=_TRAIN_WINDOW)
        self.best = float("inf")
        self.best_step = -1
        self.last_eval = -1
        self.judged = 0
        """Evaluations judged: the episodes' positions (an episode lives across evaluations)."""


class Generalisation(StreamDetector[_Stream]):
    name: ClassVar[str] = "generalisation"
    Settings: ClassVar[type[DetectorSettings]] = GeneralisationSettings

    def __init__(self, settings: GeneralisationSettings) -> None:
        super().__init__(settings, cooldown=1)
        self.episodes.unrecovered = self._unrecovered
        self._declared = Declared("val_metric", a_name)

    def new_state(self) -> _Stream:
        return _Stream()

    def forget_run(self, run_id: str) -> None:
        self._declared.forget(run_id)

    def _unrecovered(self, key: StreamKey, at: int) -> str:
        """The episode stays open while the validation loss stays above ``warn_ratio`` x its best."""
        state = self._streams.get(key)
        if state is None or not state.evals or not np.isfinite(state.best):
            return ""
        value = state.evals[-1][1]
        if value <= self.settings.warn_ratio * state.best:
            return ""
        return f"validation loss still {value:.4g}, {value / state.best:.2f}x its best {state.best:.4g}"

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        s = self.settings
        self._declared.note(batch)
        out: list[Anomaly] = []
        for key, st in streams(batch).items():
            state = self.state(key)
            names = (self._declared.get(key[0], ""), *s.metrics)
            train = st.metric(s.train_metric)
            for name in filter(None, names):
                if name not in st.columns:
                    continue
                v = st.metric(name)
                if len(v) and np.isfinite(v.value).any():
                    finite = np.isfinite(v.value)  # a NaN validation value is non_finite's, not an evaluation
                    v = type(v)(v.step[finite], v.value[finite], v.time[finite])
                    break
            else:
                state.train.extend(train.value[np.isfinite(train.value)].tolist())
                continue
            # Training values before each evaluation belong to that evaluation's interval; each
            # evaluation is judged as soon as its interval is closed (a batch may hold several).
            at = 0
            for step, value, time in zip(v.step.tolist(), v.value.tolist(), v.time.tolist(), strict=True):
                cut = int(np.searchsorted(train.step, step, side="right"))
                state.train.extend(train.value[at:cut][np.isfinite(train.value[at:cut])].tolist())
                at = cut
                if step > state.last_eval:
                    out.extend(self._judge(key, state, step, value, time))
            state.train.extend(train.value[at:][np.isfinite(train.value[at:])].tolist())
        for source, event in batch.events:
            if event.kind != "eval" or event.step is None:
                continue
            key = (source.run_id, source.rank)
            names = (self._declared.get(key[0], ""), *s.metrics)
            value = next(
                (event.fields.get(n) for n in names if n and isinstance(event.fields.get(n), int | float)), None
            )
            state = self.state(key)
            if value is not None and np.isfinite(value) and event.step > state.last_eval:
                out.extend(self._judge(key, state, event.step, float(value), event.time))
        return out

    def _judge(self, key: StreamKey, state: _Stream, step: int, value: float, time: float) -> list[Anomaly]:
        s = self.settings
        # The training interval that ends at this evaluation closes here (callers pass each evaluation once).
        state.train_meds.append(float(np.median(state.train)) if state.train else float("nan"))
        state.train.clear()
        state.last_eval = step
        state.evals.append((step, value))
        state.judged += 1
        severity, why = self._severity(state, value)
        out: list[Anomaly] = []
        if severity != NONE:
            finding = Finding(value, state.best, state.best * s.warn_ratio, self._message(state, step, value, why))
            out.extend(self.episodes.flag(key, state.judged, severity, time, finding, step=step))
        elif value <= state.best * s.warn_ratio:
            out.extend(self.episodes.quiet(key, state.judged, time))
        if value < state.best:
            state.best, state.best_step = value, step
        return out

    def _severity(self, state: _Stream, value: float) -> tuple[int, str]:
        s = self.settings
        evals, meds = list(state.evals), list(state.train_meds)
        if len(evals) <= s.min_evals or len(meds) < 2 or not np.isfinite(state.best) or state.best <= 0:
            return NONE, ""
        previous = evals[-2][1]
        med, med_before = meds[-1], meds[-2]
        if not (np.isfinite(med) and np.isfinite(med_before)):
            return NONE, ""
        ratio = value / state.best
        rose = value > previous * (1 + s.tolerance)
        train_not_rising = med <= med_before * (1 + s.tolerance)
        collapsed = med > 0 and med_before > 0 and med_before / med >= s.collapse
        if rose and train_not_rising and ratio >= s.page_ratio:
            return PAGE, "sudden"
        if rose and collapsed and ratio >= s.warn_ratio:
            return PAGE, "collapse"
        rises = 0
        for (_, a), (_, b) in zip(evals[-s.rises - 1 : -1], evals[-s.rises :], strict=True):
            rises += b > a * (1 + s.tolerance)
        falling = len(meds) > s.rises and meds[-1] <= meds[-s.rises - 1]
        if rises >= s.rises and falling:
            if ratio >= s.page_drift:
                return PAGE, "drift"
            if ratio >= s.warn_ratio:
                return WARN, "drift"
        return NONE, ""

    def _message(self, state: _Stream, step: int, value: float, why: str) -> str:
        s = self.settings
        # Both curves over the span judged: the last interval for a sudden rise, the rises for a drift.
        back = s.rises + 1 if why == "drift" else 2
        meds = list(state.train_meds)[-back:]
        from_step, from_value = state.evals[-back]
        train = meds[-1] / meds[0] if meds[0] > 0 else 1.0
        moved = "fell" if train < 1 - s.tolerance else ("rose" if train > 1 + s.tolerance else "stayed level")
        head = (
            f"validation loss rose {from_value:.4g} -> {value:.4g} over steps {from_step} -> {step}, "
            f"{value / state.best:.2f}x its best {state.best:.4g} (step {state.best_step}), while the training loss "
            f"(median per evaluation interval) {moved} {meds[0]:.4g} -> {meds[-1]:.4g} over the same steps"
        )
        if why == "collapse" or (why == "sudden" and meds[-1] > 0 and meds[-2] / meds[-1] >= s.collapse):
            advice = (
                "the model is memorising: the same batch repeated, duplicated or leaked data, a loader stuck on "
                "one shard; check the data pipeline since the last evaluation"
            )
        elif why == "sudden" and moved == "fell":
            advice = (
                "the model is memorising its training data (overfitting at once): it fits what it trains on better "
                "and generalises worse; check the data the last interval trained on (repeated or leaked batches)"
            )
        elif why == "sudden":
            advice = "the model stopped generalising at once: check the data the last interval trained on"
        else:
            advice = "it is overfitting: more data or regularisation, or stop and keep the best checkpoint"
        return f"{head}: {advice} (best checkpoint: step {state.best_step})"
