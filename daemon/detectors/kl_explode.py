"""``kl_explode``: the policy's KL from its reference is running away.

KL climbs steadily over a healthy RL run, so its level is never judged against the run's
own early value. Four rules instead:
- target: with ``target`` set (in ``[detectors.kl_explode]``, or declared by the run:
  ``trainvigil.init(config={"target_kl": 0.015})``), KL above ``target_factor`` x target for
  ``target_steps`` steps → page;
- baseline: the mean log-KL of the last ``sustain`` steps stands ``baseline_ratio`` x or more
  above the run's own long-horizon level (the robust median of the last ``window`` accepted
  steps; the explosion itself stays out of it) for ``confirm`` steps in a row → page. On real
  PPO, an LR x50 or x100 lifts the per-update KL 100-1000x within a few updates while its
  5-step mean never passes ~5x its median on healthy runs; a steady climb (RLHF's KL to the
  reference) moves the median with it;
- rate: the mean log-KL of the last ``sustain`` steps has risen, against the ``sustain``
  steps before, at a pace that doubles KL within ``double_steps`` steps, and stands clear of
  the recent noise (robust z of that mean above ``z``) → warn; held ``confirm`` steps in a
  row → page. Means of ``sustain`` steps, not single values, so one noisy step cannot do it;
- sign: the mean KL over the last ``mean_steps`` below ``negative_mean`` → warn (the estimator
  or the sign of the KL term is misconfigured).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, WARN, DetectorSettings, Finding, MetricDetector
from trainvigil.daemon.detectors._declared import Declared, a_positive_number
from trainvigil.daemon.detectors._recovery import Recovery
from trainvigil.daemon.detectors._robust import Window, consecutive, robust_z, safe_log
from trainvigil.daemon.detectors._series import StreamKey, Values
from trainvigil.daemon.detectors._settings import KlExplodeSettings
from trainvigil.schemas import Anomaly


class _Stream:
    __slots__ = ("above", "confirmed", "recent", "recovery", "tail", "watermark", "window")

    def __init__(self, cfg: KlExplodeSettings) -> None:
        self.window = Window(cfg.window)
        self.watermark = -(2**63)
        self.tail = np.full(2 * cfg.sustain - 1, np.nan)
        """The last log-KL values, to smooth and difference across batch edges."""
        self.recent = Window(cfg.mean_steps)
        self.above = 0
        self.confirmed = 0
        self.recovery = Recovery(cfg.cooldown)


def _rolling_mean(x: np.ndarray, k: int) -> np.ndarray:
    """out[i] = mean(x[i-k+1 .. i]) for i >= k-1, ignoring NaN (NaN when all k are NaN)."""
    ok = np.isfinite(x)
    total = np.concatenate(([0.0], np.cumsum(np.where(ok, x, 0.0))))
    count = np.concatenate(([0], np.cumsum(ok)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total[k:] - total[:-k]) / (count[k:] - count[:-k])


class KlExplode(MetricDetector[_Stream]):
    name: ClassVar[str] = "kl_explode"
    Settings: ClassVar[type[DetectorSettings]] = KlExplodeSettings
    coalesce: ClassVar[bool] = True

    def __init__(self, settings: KlExplodeSettings) -> None:
        super().__init__(settings)
        self.episodes.unrecovered = self._unrecovered
        self._targets = Declared("target_kl", a_positive_number)

    def new_state(self) -> _Stream:
        return _Stream(self.settings)

    def forget_run(self, run_id: str) -> None:
        self._targets.forget(run_id)

    def _unrecovered(self, key: StreamKey, at: int) -> str:
        state = self._streams.get(key)
        if state is None:
            return ""
        why = state.recovery.unrecovered(self.settings.recover_ratio, "the KL", at)
        return f"{why}; the policy still moves far more per update than it did" if why else ""

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        self._targets.note(batch)
        return super().__call__(batch)

    def judge(self, key: StreamKey, state: _Stream, v: Values) -> list[Anomaly]:
        cfg = self.settings
        n = len(v)
        logged = safe_log(v.value)
        history = np.concatenate([state.tail, logged])
        state.tail = history[-len(state.tail) :]
        with np.errstate(invalid="ignore"):
            means = _rolling_mean(history, cfg.sustain)  # means[j] ends at history[j + sustain - 1]
            level = means[-n:]
            earlier = means[-n - cfg.sustain : len(means) - cfg.sustain]
            rise = level - earlier
            scored = robust_z(state.window, logged, warmup=cfg.warmup, exclude_z=cfg.z, min_scale=cfg.min_scale)
            z = (level - scored.median) / (scored.scale / np.sqrt(cfg.sustain))
            pace = cfg.sustain * np.log(2.0) / cfg.double_steps
            fast = (rise >= pace) & (z > cfg.z)
            above_baseline = level - scored.median >= np.log(cfg.baseline_ratio)
            run = consecutive(fast | above_baseline, state.confirmed)
            state.confirmed = int(run[-1])
            target = self._targets.get(key[0], cfg.target)
            if target > 0:
                high = consecutive(v.value > cfg.target_factor * target, state.above)
                state.above = int(high[-1])
                over_target = high >= cfg.target_steps
            else:
                over_target = np.zeros(n, dtype=bool)
        finite = v.value[np.isfinite(v.value)]
        state.recent.push(finite)
        negative = state.recent.count >= cfg.mean_steps and state.recent.mean() < cfg.negative_mean
        severity = np.where(over_target | (run >= cfg.confirm), PAGE, np.where(fast, WARN, 0))
        flagged = np.flatnonzero(severity)
        if len(flagged) and not self.episodes.is_open(key):
            first = int(flagged[0])  # the usual level before the incident: what recovery is measured against
            state.recovery.opened(float(np.exp(scored.median[first])), int(v.step[first]))
        state.recovery.push(v.step, v.value)
        if negative:
            severity[-1] = max(severity[-1], WARN)

        def describe(i: int) -> Finding:
            value, step = float(v.value[i]), int(v.step[i])
            if over_target[i]:
                return Finding(
                    value,
                    target,
                    cfg.target_factor * target,
                    f"KL {value:.4g} has been above {cfg.target_factor:g}x the target {target:g} for "
                    f"{cfg.target_steps}+ steps (step {step}): raise the KL coefficient or lower the policy LR",
                )
            if above_baseline[i] and not fast[i]:
                base = float(np.exp(scored.median[i]))
                mean = float(np.exp(level[i]))
                return Finding(
                    value,
                    base,
                    cfg.baseline_ratio * base,
                    f"KL {value:.4g} (geometric mean of the last {cfg.sustain} steps {mean:.3g}) is "
                    f"{mean / base:.0f}x this run's usual level {base:.3g} at step {step}: the policy moves far "
                    "more per update than it did; an LR or a loss-scale jump, or a broken advantage "
                    "normalisation: lower the LR, clip harder or set a KL target",
                )
            if fast[i]:
                per_step = rise[i] / cfg.sustain
                doubling = np.log(2.0) / per_step if per_step > 0 else float("inf")
                return Finding(
                    value,
                    float(np.exp(scored.median[i])),
                    float(np.exp(scored.median[i] + cfg.z * scored.scale[i] / np.sqrt(cfg.sustain))),
                    f"KL {value:.4g} is doubling every {doubling:.1f} steps (step {step}): the policy is "
                    "running away from its reference; raise the KL coefficient, lower the LR or clip harder",
                )
            mean = state.recent.mean()
            return Finding(
                mean,
                None,
                cfg.negative_mean,
                f"mean KL over the last {cfg.mean_steps} steps is {mean:.3g} < {cfg.negative_mean:g}: a KL "
                "estimate should not be this negative; check the estimator (k1 vs k3) and the sign of the KL term",
            )

        return self.episodes.scan(key, v.step, severity, v.time, describe)
