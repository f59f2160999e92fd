"""``reward_hack``: reward rising for the wrong reasons.

Judged every ``every`` reward steps over the last ``recent`` steps, against the run's early
values (its first ``early`` steps):
- entropy collapse: reward slope positive while entropy < ``entropy_ratio`` x its early value;
- cheap reward: reward gained per sqrt(KL) more than ``gain_ratio`` x its early-run value (the
  early value floored by the early reward noise, so a flat start cannot make it tiny);
- length exploitation (when ``response_len`` is logged): length > ``length_ratio`` x early and
  corr(reward, length) > ``length_corr``.
An alert needs a rule to hold in ``hold`` of the last ``of`` evaluations. Healthy runs, where
reward rises, entropy declines gradually and KL climbs steadily, stay silent.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import msgspec
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from trainvigil.schemas import Anomaly

from ..decode import IngestBatch
from ._base import PAGE, Episodes, Finding
from ._series import StreamKey, StreamSteps, streams

_NAMES = ("reward", "entropy", "kl", "response_len")


class RewardHackSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    every: int = 10
    recent: int = 50
    early: int = 100
    entropy_ratio: float = 0.1
    gain_ratio: float = 5.0
    length_ratio: float = 1.5
    length_corr: float = 0.5
    hold: int = 3
    of: int = 5
    cooldown: int = 100


@dataclass(frozen=True, slots=True)
class _Early:
    """The run's early values, computed once when its first ``early`` reward steps are in."""

    entropy: float
    reward_start: float
    gain: float
    """Reward gained per sqrt(KL) over the early phase (floored by twice the early reward noise)."""
    length: float


def _nanmean(x: np.ndarray) -> float:
    finite = x[np.isfinite(x)]
    return float(finite.mean()) if len(finite) else float("nan")


def _early_stats(early: dict[str, np.ndarray]) -> _Early:
    reward, kl = early["reward"], early["kl"]
    fifth = max(1, len(reward) // 5)
    start = _nanmean(reward[:fifth])
    gained = max(_nanmean(reward[-fifth:]) - start, 2 * float(np.nanstd(reward)) if np.isfinite(reward).any() else 0)
    kl_end = _nanmean(kl[-fifth:])
    entropy = early["entropy"][np.isfinite(early["entropy"])]
    return _Early(
        entropy=float(np.median(entropy)) if len(entropy) else float("nan"),
        reward_start=start,
        gain=gained / np.sqrt(kl_end) if kl_end > 0 else float("nan"),
        length=_nanmean(early["response_len"]),
    )


class _Stream:
    __slots__ = ("early", "early_parts", "held", "seen", "since", "tail", "watermark")

    def __init__(self, cfg: RewardHackSettings) -> None:
        self.watermark = -(2**63)
        self.tail = {name: np.empty(0) for name in _NAMES}
        """The last ``recent`` values per metric, on reward steps (NaN where absent)."""
        self.early_parts: dict[str, list[np.ndarray]] = {name: [] for name in _NAMES}
        self.early: _Early | None = None
        self.seen = 0
        self.since = 0
        self.held: deque[str] = deque(maxlen=cfg.of)


class _Windows:
    """Per evaluation point, the last ``recent`` values of each metric (rows of 2-D views)."""

    def __init__(self, full: dict[str, np.ndarray], ends: np.ndarray, recent: int) -> None:
        self.rows = {n: sliding_window_view(v, recent)[ends - recent + 1] for n, v in full.items()}

    def nan_rowwise(self, fn: object, name: str) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows give NaN, which fails every rule
            return fn(self.rows[name], axis=1)  # type: ignore[operator,no-any-return]


class RewardHack:
    name: ClassVar[str] = "reward_hack"
    Settings: ClassVar[type[msgspec.Struct]] = RewardHackSettings

    def __init__(self, settings: RewardHackSettings) -> None:
        self.settings = settings
        self.episodes = Episodes(self.name, settings.cooldown)
        self._streams: dict[StreamKey, _Stream] = {}

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        out: list[Anomaly] = []
        for key, steps in streams(batch).items():
            if "reward" not in steps.columns:
                continue
            state = self._streams.get(key)
            if state is None:
                state = self._streams[key] = _Stream(self.settings)
            out.extend(self._feed(key, state, steps))
        return out

    def _feed(self, key: StreamKey, state: _Stream, s: StreamSteps) -> list[Anomaly]:
        cfg = self.settings
        rows = np.flatnonzero(s.columns["reward"][1] & (s.step > state.watermark))
        if not len(rows):
            return []
        state.watermark = int(s.step[rows[-1]])
        new = {}
        for name in _NAMES:
            values, present = s.columns.get(name, (None, None))
            new[name] = np.full(len(rows), np.nan) if values is None else np.where(present[rows], values[rows], np.nan)
        skip = 0
        if state.early is None:
            skip = min(len(rows), cfg.early - state.seen)
            for name in _NAMES:
                state.early_parts[name].append(new[name][:skip])
            state.seen += skip
            if state.seen >= cfg.early:
                state.early = _early_stats({n: np.concatenate(p) for n, p in state.early_parts.items()})
                state.early_parts = {}
        full = {n: np.concatenate([state.tail[n], new[n]]) for n in _NAMES}
        offset = len(full["reward"]) - len(rows)
        state.tail = {n: v[-cfg.recent :] for n, v in full.items()}
        if state.early is None or skip >= len(rows):
            return []
        # Evaluation points: every ``every`` reward steps after the early phase.
        counter = state.since + np.arange(1, len(rows) - skip + 1)
        state.since = int(counter[-1] % cfg.every)
        points = skip + np.flatnonzero(counter % cfg.every == 0)
        ends = offset + points
        points, ends = points[ends >= cfg.recent - 1], ends[ends >= cfg.recent - 1]
        if not len(points):
            return []
        rules = self._rules(state.early, _Windows(full, ends, cfg.recent))
        out: list[Anomaly] = []
        for j, point in enumerate(points):
            step, time = int(s.step[rows[point]]), float(s.time[rows[point]])
            rule = rules[j][0]
            state.held.append(rule)
            if rule and sum(1 for r in state.held if r == rule) >= cfg.hold:
                out.extend(self.episodes.flag(key, step, PAGE, time, rules[j][1](step), step=step))
            else:
                out.extend(self.episodes.quiet(key, step, time))
        return out

    def _rules(self, early: _Early, w: _Windows) -> list[tuple[str, Callable[[int], Finding]]]:
        """Per evaluation point: the first rule that holds ("" if none) and how to explain it."""
        cfg = self.settings
        reward = w.rows["reward"]
        mean_reward = w.nan_rowwise(np.nanmean, "reward")
        x = np.arange(cfg.recent, dtype=np.float64) - (cfg.recent - 1) / 2
        slope = np.nansum(x * (reward - mean_reward[:, None]), axis=1) / (x * x).sum()
        enough = np.isfinite(reward).sum(axis=1) >= cfg.recent // 2
        rows = w.rows["entropy"]
        entropy = np.median(rows, axis=1) if np.isfinite(rows).all() else w.nan_rowwise(np.nanmedian, "entropy")
        collapsed = enough & (slope > 0) & (entropy < cfg.entropy_ratio * early.entropy)
        kl = w.nan_rowwise(np.nanmean, "kl")
        with np.errstate(invalid="ignore", divide="ignore"):
            gain = (mean_reward - early.reward_start) / np.sqrt(kl)
            cheap = enough & (kl > 0) & (gain > cfg.gain_ratio * early.gain) & (early.gain > 0)
            length = w.nan_rowwise(np.nanmean, "response_len")
            corr = _rowwise_corr(reward, w.rows["response_len"])
            long = enough & (length > cfg.length_ratio * early.length) & (corr > cfg.length_corr)
        out: list[tuple[str, Callable[[int], Finding]]] = []
        for j in range(len(reward)):
            if collapsed[j]:
                out.append(("entropy", partial(self._entropy_finding, float(entropy[j]), early.entropy)))
            elif cheap[j]:
                out.append(("gain", partial(self._gain_finding, float(gain[j]), early.gain)))
            elif long[j]:
                out.append(("length", partial(self._length_finding, float(length[j]), early.length, float(corr[j]))))
            else:
                out.append(("", _no_finding))
        return out

    def _entropy_finding(self, entropy: float, early: float, step: int) -> Finding:
        ratio = self.settings.entropy_ratio
        return Finding(
            entropy,
            early,
            ratio * early,
            f"reward is rising while policy entropy {entropy:.3g} fell below {ratio:g}x its early {early:.3g} "
            f"(step {step}): the policy may be exploiting the reward model; inspect samples, raise the entropy "
            "bonus or the KL coefficient",
        )

    def _gain_finding(self, gain: float, early: float, step: int) -> Finding:
        return Finding(
            gain,
            early,
            self.settings.gain_ratio * early,
            f"reward gained per sqrt(KL) is {gain / early:.1f}x its early-run value (step {step}): reward is coming "
            "too cheaply; inspect samples for reward-model exploits",
        )

    def _length_finding(self, length: float, early: float, corr: float, step: int) -> Finding:
        return Finding(
            length,
            early,
            self.settings.length_ratio * early,
            f"responses grew to {length / early:.1f}x their early length and reward follows length (corr "
            f"{corr:.2f}) at step {step}: the reward model is paying for length; add a length penalty or normalise "
            "reward by length",
        )


def _no_finding(step: int) -> Finding:
    return Finding(None, None, None, "")


def _rowwise_corr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation per row over the positions where both are finite (NaN if undefined)."""
    both = np.isfinite(a) & np.isfinite(b)
    n = both.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        a0 = np.where(both, a, 0.0)
        b0 = np.where(both, b, 0.0)
        ma, mb = a0.sum(axis=1) / n, b0.sum(axis=1) / n
        da, db = np.where(both, a0 - ma[:, None], 0.0), np.where(both, b0 - mb[:, None], 0.0)
        return (da * db).sum(axis=1) / np.sqrt((da * da).sum(axis=1) * (db * db).sum(axis=1))
