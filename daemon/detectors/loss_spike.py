"""``loss_spike``: three rules over the loss, one alert episode per incident.

- transient: robust z of log loss against its rolling median/MAD above ``transient_z`` and
  loss >= ``transient_min_ratio`` x its rolling median → warn;
- persistent: loss ≥ ``persistent_ratio`` x its rolling level for ``persistent_steps``
  consecutive steps → page (the rolling level is the exponentiated rolling median of log
  loss, the mean's robust stand-in; elevated values stay out of it);
- divergence: loss ≥ ``divergence_ratio`` x the largest of the first ``early_steps`` losses → page.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from trainvigil.daemon.detectors._base import PAGE, WARN, DetectorSettings, Finding, MetricDetector
from trainvigil.daemon.detectors._robust import Window, consecutive, robust_z, safe_log
from trainvigil.daemon.detectors._series import StreamKey, Values
from trainvigil.schemas import Anomaly


class LossSpikeSettings(DetectorSettings, frozen=True, forbid_unknown_fields=True):
    metric: str = "loss"
    window: int = 256
    warmup: int = 32
    transient_z: float = 10.0
    """Raised from 7 with the harness (7: ~7 false episodes per 100k clean steps)."""
    transient_min_ratio: float = 3.0
    """A transient flag also needs loss >= this x its rolling median."""
    min_scale: float = 0.05
    persistent_ratio: float = 2.0
    persistent_steps: int = 5
    early_steps: int = 100
    divergence_ratio: float = 10.0
    cooldown: int = 50


class _Stream:
    __slots__ = ("early", "elevated", "seen", "watermark", "window")

    def __init__(self, cfg: LossSpikeSettings) -> None:
        self.window = Window(cfg.window)
        self.watermark = -(2**63)
        self.seen = 0
        self.early = -np.inf
        self.elevated = 0


class LossSpike(MetricDetector[_Stream]):
    name: ClassVar[str] = "loss_spike"
    Settings: ClassVar[type[DetectorSettings]] = LossSpikeSettings

    def new_state(self) -> _Stream:
        return _Stream(self.settings)

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
            level = np.exp(scored.median)
            elevated = v.value >= cfg.persistent_ratio * level
            run = consecutive(elevated, state.elevated)
            state.elevated = int(run[-1])
            persistent = run >= cfg.persistent_steps
            diverged = (v.value >= cfg.divergence_ratio * early) & (state.seen > cfg.early_steps)
            transient = (scored.z > cfg.transient_z) & (v.value >= cfg.transient_min_ratio * level)
        severity = np.where(persistent | diverged, PAGE, np.where(transient, WARN, 0))

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
                    float(level[i]),
                    cfg.persistent_ratio * float(level[i]),
                    f"loss has stayed >= {cfg.persistent_ratio:g}x its rolling level {level[i]:.4g} for "
                    f"{int(run[i])} steps (step {step}): look for a data shift or an LR schedule jump; "
                    "consider rolling back to the last good checkpoint",
                )
            return Finding(
                value,
                float(level[i]),
                float(level[i] * np.exp(cfg.transient_z * scored.scale[i])),
                f"loss {value:.4g} spiked to {value / level[i]:.1f}x its rolling median at step {step} "
                f"(robust z {scored.z[i]:.1f}): check that batch for corrupt or outlier samples",
            )

        return self.episodes.scan(key, v.step, severity, v.time, describe)
