"""``loss_spike``: three rules over the loss, one alert episode per incident.

- transient: robust z of log loss against its rolling median/MAD above ``transient_z`` and
  loss >= ``transient_min_ratio`` x its rolling median → warn;
- persistent: loss ≥ ``persistent_ratio`` x its rolling level for ``persistent_steps``
  consecutive steps → page (the rolling level is the exponentiated rolling median of log
  loss, or the window's 90th percentile when that is ``multi_level`` x the median or more: a
  loss that lives on several levels is judged against its upper one; elevated values stay out);
- divergence: loss ≥ ``divergence_ratio`` x the largest of the first ``early_steps`` losses
  and ≥ ``divergence_upper`` x the window's 90th percentile → page.

The transient and persistent rules also need the loss to have risen above the level it is
judged against by at least ``min_rise`` x the run's own scale (the largest of its first
``early_steps`` losses, what the model cost before it learnt anything). Both rules are relative,
and a loss near its floor moves by large factors for no reason: a curve fit whose MSE fell
from ~2 to ~1e-5 (the corpus's ``reg-curve-clean``) blips to 5-60x its rolling level for five
steps and more (Adam near a minimum), paging six times on relative size alone; those blips rise
by 1.4e-3 of the run's scale at most, while the faults the corpus holds rise by 0.3 (an LR x30
on a GPT) to thousands (a poisoned batch at a loss of ~1e-5) of it. The default (1e-2) sits
between, with room on both sides.

Recovered means recovered: once ``cooldown`` steps pass without a flag, the episode clears only
if the median of the last ``cooldown`` losses is back within ``recover_ratio`` x the level the
loss had when the episode opened. A run that settles clearly worse stays open, says so once
(state ``degraded``, with the level before and now), and names what the data shows: a jump in
the logged ``lr`` that a schedule does not explain (more than ``lr_jump`` x either way since
before the incident). (An LR x30 that the run survives at 1.7x its old loss used to read as
recovered after 60 steps.)
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, WARN, DetectorSettings, Finding, MetricDetector
from trainvigil.daemon.detectors._recovery import Recovery
from trainvigil.daemon.detectors._robust import Window, consecutive, robust_z, safe_log
from trainvigil.daemon.detectors._series import StreamKey, Values, is_rl, streams
from trainvigil.daemon.detectors._settings import LossSpikeSettings
from trainvigil.schemas import Anomaly

LR_HISTORY = 512
"""Logged lrs kept per stream, to name an lr jump as the cause of a loss that did not recover."""
LR_LEAD = 20
"""The lr before an incident is read this many steps before its first flag: a jump leads the loss."""


class _Stream:
    __slots__ = (
        "early",
        "elevated",
        "lr",
        "pre_lr",
        "recovery",
        "rl",
        "seen",
        "watermark",
        "window",
    )

    def __init__(self, cfg: LossSpikeSettings) -> None:
        self.window = Window(cfg.window)
        self.watermark = -(2**63)
        self.seen = 0
        self.early = -np.inf
        self.elevated = 0
        self.recovery = Recovery(cfg.cooldown)
        self.lr: deque[tuple[int, float]] = deque(maxlen=LR_HISTORY)
        """(step, lr) of the latest logged lrs, this batch's included."""
        self.pre_lr = float("nan")
        """The lr ``LR_LEAD`` steps before the open episode began (a jump often leads the loss by a few steps)."""
        self.rl = False
        """The stream logs RL metrics (reward, kl or entropy): its loss level is no fault signal."""


class LossSpike(MetricDetector[_Stream]):
    name: ClassVar[str] = "loss_spike"
    Settings: ClassVar[type[DetectorSettings]] = LossSpikeSettings
    coalesce: ClassVar[bool] = True

    def __init__(self, settings: LossSpikeSettings) -> None:
        super().__init__(settings)
        self.episodes.unrecovered = self._unrecovered

    def new_state(self) -> _Stream:
        return _Stream(self.settings)

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        for key, steps in streams(batch).items():
            state = self.state(key)
            if is_rl(steps):
                state.rl = True
            lr = steps.metric("lr")
            state.lr.extend(zip(lr.step[-LR_HISTORY:].tolist(), lr.value[-LR_HISTORY:].tolist(), strict=True))
        return super().__call__(batch)

    @staticmethod
    def _lr_at(state: _Stream, step: int) -> float:
        """The lr logged last at or before ``step`` (NaN when none is kept)."""
        before = [value for at, value in state.lr if at <= step]
        return before[-1] if before else float("nan")

    def _unrecovered(self, key: StreamKey, at: int) -> str:
        cfg, state = self.settings, self._streams.get(key)
        why = "" if state is None else state.recovery.unrecovered(cfg.recover_ratio, "the loss", at)
        if not why or state is None:
            return ""
        lrs = [value for step, value in state.lr if step <= at]
        now_lr = lrs[-1] if lrs else float("nan")
        ratio = now_lr / state.pre_lr if state.pre_lr > 0 and now_lr > 0 else 1.0
        if ratio >= cfg.lr_jump or ratio <= 1 / cfg.lr_jump:
            why += (
                f"; the logged lr went {state.pre_lr:.3g} -> {now_lr:.3g} ({ratio:.3g}x) since then, which no "
                "schedule explains: restore the LR and resume from the last checkpoint before step "
                f"{state.recovery.since}"
            )
        else:
            why += "; look for a data change or a restart from another checkpoint at that step"
        return why

    def _early_max(self, state: _Stream, v: Values) -> np.ndarray:
        """Per value: the largest finite loss among the stream's first ``early_steps`` (so far)."""
        cfg = self.settings
        finite = np.isfinite(v.value)
        index = state.seen + np.cumsum(finite)
        early_vals = np.where(finite & (index <= cfg.early_steps), v.value, -np.inf)
        running = np.maximum.accumulate(np.maximum(early_vals, state.early))
        state.seen = int(index[-1])
        state.early = float(running[-1])
        return running

    def judge(self, key: StreamKey, state: _Stream, v: Values) -> list[Anomaly]:
        cfg = self.settings
        logged = safe_log(v.value)
        scored = robust_z(
            state.window,
            logged,
            warmup=cfg.warmup,
            exclude_z=cfg.transient_z,
            min_scale=cfg.min_scale,
            exclude_above=float(np.log(cfg.persistent_ratio)),
        )
        early = self._early_max(state, v)
        with np.errstate(invalid="ignore"):
            # The window's upper level (its 90th percentile) where the value was judged: a loss that
            # lives on several levels (PPO: ~0.5 on most updates, ~60-120 when episodes end) is not
            # elevated by visiting its upper level.
            upper = np.exp(scored.upper)
            level = np.exp(scored.median)
            # Only a loss that lives on several levels (its p90 >= ``multi_level`` x its median) is
            # judged against its upper level; a unimodal one keeps its median (p90 within ~10%).
            high = np.where(upper >= cfg.multi_level * level, upper, level)
            # The least rise that counts, from the run's own scale: near its floor a loss's relative
            # moves are large and harmless (a negative or absent early loss sets no floor).
            rise = cfg.min_rise * np.maximum(early, 0.0)
            elevated = (v.value >= cfg.persistent_ratio * high) & (v.value - high >= rise)
            run = consecutive(elevated, state.elevated)
            state.elevated = int(run[-1])
            # In RL the loss level follows the return (the value loss scales with it), so a level
            # shift is not a fault there: RL runs get the transient rule only (kl_explode,
            # reward_hack and non_finite judge the rest).
            persistent = (run >= cfg.persistent_steps) & (not state.rl)
            # Divergence: far above the early losses and clear of the recent upper level too (an RL
            # value loss grows with the return: 12x its early largest on a healthy PPO run).
            diverged = (
                (v.value >= cfg.divergence_ratio * early)
                & ~(v.value < cfg.divergence_upper * upper)
                & (state.seen > cfg.early_steps)
                & (not state.rl)
            )
            transient = (
                (scored.z > cfg.transient_z) & (v.value >= cfg.transient_min_ratio * level) & (v.value - level >= rise)
            )
        severity = np.where(persistent | diverged, PAGE, np.where(transient, WARN, 0))
        flagged = np.flatnonzero(severity)
        if len(flagged) and not self.episodes.is_open(key):
            first = int(flagged[0])  # the level before the incident: what recovery is measured against
            state.recovery.opened(float(level[first]), int(v.step[first]))
            state.pre_lr = self._lr_at(state, int(v.step[first]) - LR_LEAD)
        state.recovery.push(v.step, v.value)

        def describe(i: int) -> Finding:
            value, step = float(v.value[i]), int(v.step[i])
            if diverged[i]:
                return Finding(
                    value,
                    float(early[i]),
                    cfg.divergence_ratio * float(early[i]),
                    f"loss {value:.4g} at step {step} is {value / early[i]:.1f}x the largest early loss: the run "
                    "is diverging; stop it, lower the learning rate and resume from the last good checkpoint",
                )
            if persistent[i]:
                return Finding(
                    value,
                    float(high[i]),
                    max(cfg.persistent_ratio * float(high[i]), float(high[i] + rise[i])),
                    f"loss has stayed >= {cfg.persistent_ratio:g}x its rolling level {high[i]:.4g} for "
                    f"{int(run[i])} steps (step {step}): look for a data shift or an LR schedule jump; "
                    "consider rolling back to the last good checkpoint",
                )
            return Finding(
                value,
                float(level[i]),
                max(float(level[i] * np.exp(cfg.transient_z * scored.scale[i])), float(level[i] + rise[i])),
                f"loss {value:.4g} spiked to {value / level[i]:.1f}x its rolling median at step {step} "
                f"(robust z {scored.z[i]:.1f}): check that batch for corrupt or outlier samples",
            )

        return self.episodes.scan(key, v.step, severity, v.time, describe)
