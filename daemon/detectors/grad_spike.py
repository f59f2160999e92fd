"""``grad_spike``: the global grad norm jumps far above its recent level.

Judged in log space (grad norms are positive and heavy-tailed) against a rolling median
and MAD over the last ``window`` accepted steps: warn at robust z > ``warn_z``, page at
z > ``page_z`` (either only for a norm >= ``min_ratio`` x the rolling median), or a norm
>= ``page_ratio`` x the rolling median that is also ``ratio_min_z`` robust z clear of the
series' own spread: on real runs a wide series (PPO's grad norm swings 5x between updates;
a warm-up multiplies the norm 10x in a hundred steps) reaches 10x its median at z 2, which is
no spike. Spikes never enter the
baseline, so a burst cannot teach the detector that spikes are normal. Until the window is
full, the baseline is re-estimated every ``fill_block`` steps: early in training it goes
stale fastest.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, WARN, DetectorSettings, Finding, MetricDetector
from trainvigil.daemon.detectors._robust import Window, robust_z, safe_log
from trainvigil.daemon.detectors._series import StreamKey, Values, is_rl, streams
from trainvigil.daemon.detectors._settings import GradSpikeSettings
from trainvigil.schemas import Anomaly

RECENT = 20
"""Values before a flag that give its recent level, printed when it differs from the baseline."""


class _Stream:
    __slots__ = ("recent", "rl", "watermark", "window")

    def __init__(self, cfg: GradSpikeSettings) -> None:
        self.window = Window(cfg.window)
        self.watermark = -(2**63)
        self.rl = False
        """The stream logs RL metrics (``_series.is_rl``)."""
        self.recent = np.empty(0)
        """The last ``RECENT`` finite values before this batch."""


class GradSpike(MetricDetector[_Stream]):
    name: ClassVar[str] = "grad_spike"
    Settings: ClassVar[type[DetectorSettings]] = GradSpikeSettings
    coalesce: ClassVar[bool] = True

    def new_state(self) -> _Stream:
        return _Stream(self.settings)

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        for key, steps in streams(batch).items():
            if is_rl(steps):
                self.state(key).rl = True
        return super().__call__(batch)

    def judge(self, key: StreamKey, state: _Stream, v: Values) -> list[Anomaly]:
        cfg = self.settings
        scored = robust_z(
            state.window,
            safe_log(v.value),
            warmup=cfg.warmup,
            exclude_z=cfg.warn_z,
            min_scale=cfg.min_scale,
            fill_block=cfg.fill_block,
        )
        with np.errstate(invalid="ignore"):
            # The window's upper level (p90) where the value was judged: the ratio rule is measured
            # from it too, so a norm that lives on two levels (PPO: ~0.6 on most updates, 15-25 when
            # episodes end) is not a spike when it visits its upper one (a unimodal p90 is ~1.5x its median).
            upper = np.exp(scored.upper)
            ratio = v.value / np.exp(scored.median)
            # A non-finite norm is non_finite's alert, not a spike.
            big = ratio >= cfg.min_ratio
            # RL's pre-clip norm jumps 20-40x whenever the value targets move (real PPO, healthy):
            # there only the z rules judge, and kl_explode/non_finite watch the blow-ups.
            over_upper = ~(v.value < cfg.page_ratio * upper) & (not state.rl)
            by_ratio = (ratio >= cfg.page_ratio) & over_upper & (scored.z > cfg.ratio_min_z) & np.isfinite(v.value)
            page = (big & (scored.z > cfg.page_z)) | by_ratio
            warn = big & (scored.z > cfg.warn_z)
        severity = np.where(page, PAGE, np.where(warn, WARN, 0))
        before = state.recent
        finite = v.value[np.isfinite(v.value)]
        state.recent = np.concatenate([before, finite])[-RECENT:]

        def recent_level(i: int) -> str:
            """ ", while the last 20 steps ran at ~X" when the recent level is far from the baseline
            (a baseline that predates a level shift: after a collapse, the old median misleads)."""
            prior = np.concatenate([before, v.value[:i][np.isfinite(v.value[:i])]])[-RECENT:]
            if len(prior) < RECENT // 2:
                return ""
            recent = float(np.median(prior))
            level = float(np.exp(scored.median[i]))
            if not (recent > 0 and (recent > 3 * level or recent < level / 3)):
                return ""
            return (
                f"; its last {len(prior)} steps ran at ~{recent:.4g} ({float(v.value[i]) / recent:.1f}x that): "
                "the median is from before a level shift"
            )

        def describe(i: int) -> Finding:
            level = float(np.exp(scored.median[i]))
            # The bar of the rule that fired, so the printed threshold is one the value crossed.
            z_bar = cfg.page_z if page[i] and not by_ratio[i] else cfg.warn_z
            bar = (
                cfg.page_ratio * level
                if by_ratio[i]
                else max(level * float(np.exp(z_bar * scored.scale[i])), cfg.min_ratio * level)
            )
            return Finding(
                float(v.value[i]),
                level,
                bar,
                f"{cfg.metric} {v.value[i]:.4g} is {ratio[i]:.1f}x its rolling median {level:.4g} "
                f"(robust z {scored.z[i]:.1f}) at step {int(v.step[i])}{recent_level(i)}: check that batch for "
                "outliers, lower the learning rate or tighten gradient clipping",
            )

        return self.episodes.scan(key, v.step, severity, v.time, describe)
