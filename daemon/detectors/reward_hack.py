"""``reward_hack``: reward rising for the wrong reasons.

Judged every ``every`` reward steps over the last ``recent`` steps, against the run's early
values (its first ``early`` steps) or its own recent past (the ``reference`` reward steps
before the last ``short``):
- true return collapses: when the run logs a held-out return next to its training reward
  (``true_return``, ``eval_return``, ``eval_reward``, or the name it declares with
  ``trainvigil.init(config={"eval_metric": ...})``), its median over the last ``short`` steps fell
  below ``(1 - eval_drop)`` x its reference median while the training reward rose, or below
  ``eval_collapse`` x it whatever the training reward did (not after an lr jump: that is
  kl_explode's page). A rising training reward is the textbook exploit, but a swapped or rescaled
  reward function moves the reference it is judged against, so the training reward can look level
  or falling while the policy exploits it; the page says which it was. The deeper bar is for
  healthy PPO, whose return routinely halves for a few dozen updates and comes back. The episode
  stays open until the held-out return is back above ``(1 - eval_drop)`` x the level it fell from;
- entropy collapse, fast: entropy's median over the last ``short`` steps fell below
  ``entropy_drop`` x its reference median while the logged ``lr`` stayed above ``lr_kept``
  x its reference (an annealed LR narrows the policy by design) and the reward did not fall;
- entropy collapse, deep: reward slope positive while entropy < ``entropy_ratio`` x its early value;
- cheap reward (off by default, ``gain_ratio = 0``): reward gained per sqrt(KL) more than
  ``gain_ratio`` x its early-run value. On real PPO every healthy run reached 5-7x (early KL
  and early reward are both tiny), so it paged on all of them;
- length exploitation (when ``response_len`` is logged): length > ``length_ratio`` x early and
  corr(reward, length) > ``length_corr``.
An alert needs a rule to hold in ``hold`` of the last ``of`` evaluations. Healthy runs, where
reward rises, entropy declines gradually and KL climbs steadily, stay silent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import numpy as np

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors._base import PAGE, DetectorSettings, Finding, StreamDetector
from trainvigil.daemon.detectors._declared import Declared, a_name
from trainvigil.daemon.detectors._series import StreamKey, StreamSteps, streams
from trainvigil.daemon.detectors._settings import RewardHackSettings
from trainvigil.schemas import Anomaly

_NAMES = ("reward", "entropy", "kl", "response_len", "lr", "eval")
EVAL_METRICS = ("true_return", "eval_return", "eval_reward")
"""Held-out returns read as the ``eval`` series unless a run declares its own ``eval_metric``."""


@dataclass(frozen=True, slots=True)
class _Early:
    """The run's early values, computed once when its first ``early`` reward steps are in."""

    entropy: float
    reward_start: float
    gain: float
    """Reward gained per sqrt(KL) over the early phase (floored by twice the early reward noise)."""
    length: float
    lr: float
    """The largest lr logged early (NaN when none): an lr far above it is a blow-up, not a schedule."""


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
        lr=float(np.nanmax(early["lr"])) if np.isfinite(early["lr"]).any() else float("nan"),
    )


class _Stream:
    __slots__ = ("early", "early_parts", "eval_now", "fell_from", "held", "lr", "seen", "since", "tail", "watermark")

    def __init__(self, cfg: RewardHackSettings) -> None:
        self.watermark = -(2**63)
        self.tail = {name: np.empty(0) for name in _NAMES}
        """The last ``max(recent, short + reference)`` values per metric, on reward steps (NaN where absent)."""
        self.early_parts: dict[str, list[np.ndarray]] = {name: [] for name in _NAMES}
        self.early: _Early | None = None
        self.seen = 0
        self.since = 0
        self.held: deque[str] = deque(maxlen=cfg.of)
        self.lr = float("nan")
        """The latest lr logged (on any step): it is carried to the reward steps that follow."""
        self.fell_from = float("nan")
        """The held-out return's level before its collapse was paged (NaN: no collapse open)."""
        self.eval_now = float("nan")
        """The held-out return's median over the last ``short`` steps at the latest evaluation point."""


class _Windows:
    """Rolling sums over the last ``recent`` values ending at each evaluation point (O(n), NaN-aware)."""

    def __init__(self, full: dict[str, np.ndarray], ends: np.ndarray, recent: int) -> None:
        self.full, self.ends, self.recent = full, ends, recent
        self.finite = {n: np.isfinite(v) for n, v in full.items()}
        self.zeroed = {n: np.where(self.finite[n], v, 0.0) for n, v in full.items()}

    def total(self, x: np.ndarray) -> np.ndarray:
        """Sum of ``x`` over each evaluation window."""
        c = np.concatenate(([0.0], np.cumsum(x, dtype=np.float64)))
        return c[self.ends + 1] - c[self.ends + 1 - self.recent]

    def mean(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(count of finite values, their mean) per window."""
        n = self.total(self.finite[name])
        with np.errstate(invalid="ignore", divide="ignore"):
            return n, self.total(self.zeroed[name]) / n

    def window(self, name: str, j: int) -> np.ndarray:
        end = int(self.ends[j])
        return self.full[name][end + 1 - self.recent : end + 1]


class RewardHack(StreamDetector[_Stream]):
    name: ClassVar[str] = "reward_hack"
    Settings: ClassVar[type[DetectorSettings]] = RewardHackSettings
    coalesce: ClassVar[bool] = True
    reads: ClassVar[tuple[str, ...]] = (*(n for n in _NAMES if n != "eval"), *EVAL_METRICS)
    """The metrics it reads (``eval`` is the series its held-out returns feed), for the web view's table."""

    def __init__(self, settings: RewardHackSettings) -> None:
        super().__init__(settings)
        self.episodes.unrecovered = self._unrecovered
        self._eval_names = Declared("eval_metric", a_name)

    def new_state(self) -> _Stream:
        return _Stream(self.settings)

    def forget_run(self, run_id: str) -> None:
        self._eval_names.forget(run_id)

    def _unrecovered(self, key: StreamKey, at: int) -> str:
        """A collapsed held-out return keeps its episode open until it is back near the level it fell from:
        once the reference window has slid past the collapse no rule flags it, yet the policy is still broken."""
        state = self._streams.get(key)
        if state is None or not np.isfinite(state.fell_from):
            return ""
        keep = (1 - self.settings.eval_drop) * state.fell_from
        if not np.isfinite(state.eval_now) or state.eval_now < keep:
            return f"held-out return still {state.eval_now:.4g}, below {keep:.4g} (it fell from {state.fell_from:.4g})"
        state.fell_from = float("nan")  # recovered: the episode clears now
        return ""

    def __call__(self, batch: IngestBatch) -> list[Anomaly]:
        self._eval_names.note(batch)
        out: list[Anomaly] = []
        for key, steps in streams(batch).items():
            if "reward" not in steps.columns:
                continue
            out.extend(self._feed(key, self.state(key), steps))
        return out

    def _feed(self, key: StreamKey, state: _Stream, s: StreamSteps) -> list[Anomaly]:
        cfg = self.settings
        rows = np.flatnonzero(s.columns["reward"][1] & (s.step > state.watermark))
        if not len(rows):
            return []
        state.watermark = int(s.step[rows[-1]])
        new = {}
        eval_names = (self._eval_names.get(key[0], ""), *EVAL_METRICS)
        eval_name = next((n for n in eval_names if n and n in s.columns), "")
        for name in _NAMES:
            column = s.columns.get(eval_name if name == "eval" else name)
            if name == "lr":
                new[name] = _carried(column, rows, state)
                continue
            new[name] = (
                np.full(len(rows), np.nan) if column is None else np.where(column[1][rows], column[0][rows], np.nan)
            )
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
        keep = max(cfg.recent, cfg.short + cfg.reference)
        state.tail = {n: v[-keep:] for n, v in full.items()}
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
            end = int(ends[j]) + 1
            state.eval_now = _median(full["eval"][end - cfg.short : end], cfg.short)
            rule = rules[j][0]
            state.held.append(rule)
            if rule and sum(1 for r in state.held if r == rule) >= cfg.hold:
                finding = rules[j][1](step)
                if rule == "eval" and not np.isfinite(state.fell_from):
                    state.fell_from = float(finding.baseline if finding.baseline is not None else np.nan)
                out.extend(self.episodes.flag(key, step, PAGE, time, finding, step=step))
            else:
                out.extend(self.episodes.quiet(key, step, time))
        return out

    def _rules(self, early: _Early, w: _Windows) -> list[tuple[str, Callable[[int], Finding]]]:
        """Per evaluation point: the first rule that holds ("" if none) and how to explain it."""
        cfg = self.settings
        count, mean_reward = w.mean("reward")
        enough = count >= cfg.recent // 2
        # The slope's sign: sum((t - mean t)(y - mean y)) over finite rewards.
        t = np.arange(len(w.full["reward"]), dtype=np.float64)
        f = w.finite["reward"]
        sum_t, sum_ty = w.total(t * f), w.total(t * w.zeroed["reward"])
        with np.errstate(invalid="ignore", divide="ignore"):
            rising = sum_ty - sum_t * mean_reward > 0
        # Median entropy below the bar <=> more than half of the window's entropies are below it.
        bar = cfg.entropy_ratio * early.entropy
        n_entropy = w.total(w.finite["entropy"])
        below = w.total(
            w.finite["entropy"] & (w.full["entropy"] < bar) if np.isfinite(bar) else w.finite["entropy"] & False
        )
        collapsed = enough & rising & (n_entropy > 0) & (below * 2 > n_entropy)
        n_kl, kl = w.mean("kl")
        n_len, length = w.mean("response_len")
        with np.errstate(invalid="ignore", divide="ignore"):
            gain = (mean_reward - early.reward_start) / np.sqrt(kl)
            cheap = (
                enough
                & (cfg.gain_ratio > 0)
                & (n_kl > 0)
                & (kl > 0)
                & (gain > cfg.gain_ratio * early.gain)
                & (early.gain > 0)
            )
            longer = enough & (n_len >= cfg.recent // 2) & (length > cfg.length_ratio * early.length)
        out: list[tuple[str, Callable[[int], Finding]]] = []
        for j in range(len(w.ends)):
            past = self._past(w, j)
            if past is not None and (found := self._against_past(past, early.lr)) is not None:
                out.append(found)
            elif collapsed[j] and not _lr_jumped(past, early.lr):
                median = float(np.nanmedian(w.window("entropy", j)))
                out.append(("entropy", partial(self._entropy_finding, median, early.entropy)))
            elif cheap[j]:
                out.append(("gain", partial(self._gain_finding, float(gain[j]), early.gain)))
            elif longer[j] and (corr := _corr(w.window("reward", j), w.window("response_len", j))) > cfg.length_corr:
                out.append(("length", partial(self._length_finding, float(length[j]), early.length, corr)))
            else:
                out.append(("", _no_finding))
        return out

    def _past(self, w: _Windows, j: int) -> dict[str, tuple[float, float]] | None:
        """Per metric, (median of the last ``short`` steps, median of the ``reference`` before them)."""
        cfg = self.settings
        end = int(w.ends[j]) + 1
        if end < cfg.short + cfg.reference:
            return None
        out = {}
        for name in ("reward", "entropy", "lr", "eval"):
            now = _median(w.full[name][end - cfg.short : end], cfg.short)
            ref = _median(w.full[name][end - cfg.short - cfg.reference : end - cfg.short], cfg.reference)
            if np.isfinite(now) and np.isfinite(ref):
                out[name] = (now, ref)
        return out if "reward" in out else None

    def _against_past(
        self, past: dict[str, tuple[float, float]], early_lr: float
    ) -> tuple[str, Callable[[int], Finding]] | None:
        """The rules judged against the run's own recent past: a falling true return, a fast entropy collapse
        (not after an lr jump: a policy blown up by its LR collapses too, and that is kl_explode's page)."""
        cfg = self.settings
        reward_now, reward_ref = past["reward"]
        if "eval" in past and not _lr_jumped(past, early_lr):
            eval_now, eval_ref = past["eval"]
            rose = _direction(reward_now, reward_ref) == "rose"
            bar = (1 - cfg.eval_drop) if rose else cfg.eval_collapse
            if eval_ref > 0 and eval_now < bar * eval_ref:
                return "eval", partial(self._eval_finding, eval_now, eval_ref, reward_now, reward_ref)
        if "entropy" in past and reward_now >= reward_ref:
            entropy_now, entropy_ref = past["entropy"]
            lr_now, lr_ref = past.get("lr", (1.0, 1.0))
            kept = lr_now >= cfg.lr_kept * lr_ref and not _lr_jumped(past, early_lr)
            if entropy_ref > 0 and entropy_now < cfg.entropy_drop * entropy_ref and kept:
                return "entropy_fast", partial(self._entropy_fast_finding, entropy_now, entropy_ref, lr_now, lr_ref)
        return None

    def _eval_finding(self, now: float, ref: float, reward_now: float, reward_ref: float, step: int) -> Finding:
        cfg = self.settings
        moved = _direction(reward_now, reward_ref)
        bar = (1 - cfg.eval_drop) if moved == "rose" else cfg.eval_collapse
        if moved == "rose":
            why = "the policy is exploiting what the training reward pays for"
        else:
            why = (
                "the policy is getting worse at the task and the training reward is no guide to it: the reward "
                "function changed (a swapped or rescaled reward model), the policy exploits it, or it collapsed"
            )
        return Finding(
            now,
            ref,
            bar * ref,
            f"the held-out return collapsed {ref:.4g} -> {now:.4g} ({now / ref:.2f}x; median of the last {cfg.short} "
            f"updates against the {cfg.reference} before) while the training reward {moved} {reward_ref:.4g} -> "
            f"{reward_now:.4g} (step {step}): {why}; inspect episodes, fix the reward and resume from a checkpoint "
            "before the collapse",
        )

    def _entropy_fast_finding(self, now: float, ref: float, lr_now: float, lr_ref: float, step: int) -> Finding:
        cfg = self.settings
        return Finding(
            now,
            ref,
            cfg.entropy_drop * ref,
            f"policy entropy fell {ref:.3g} -> {now:.3g} ({now / ref:.2f}x in about {cfg.short} updates) while the "
            f"lr stayed at {lr_now / lr_ref:.2f}x its level and the reward held (step {step}): faster than the LR "
            "schedule explains; the policy is collapsing onto a few actions (an exploit, or a wrong sign or "
            "size of the entropy coefficient); inspect samples, check the entropy bonus",
        )

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


def _carried(column: tuple[np.ndarray, np.ndarray] | None, rows: np.ndarray, state: _Stream) -> np.ndarray:
    """Per reward row, the latest lr logged at or before it, earlier batches included. The lr often comes
    from another ``log()`` call than the reward (``watch()`` logs it at the optimizer step), so live it
    sits on rows of its own; stored, the rows of one step are merged. Carried, both read the same."""
    if column is None:
        return np.full(len(rows), state.lr)
    values, present = column
    latest = np.maximum.accumulate(np.where(present & np.isfinite(values), np.arange(len(values)), -1))
    at = latest[rows]
    out = np.where(at >= 0, values[np.maximum(at, 0)], state.lr)
    if latest[-1] >= 0:
        state.lr = float(values[latest[-1]])
    return out


def _lr_jumped(past: dict[str, tuple[float, float]] | None, early: float, factor: float = 3.0) -> bool:
    """The logged lr stands ``factor`` x above its early largest or its recent past: an LR blow-up
    (kl_explode's page), not a reward hack, so the reward model is not blamed for it."""
    if past is None or "lr" not in past:
        return False
    now, ref = past["lr"]
    return (ref > 0 and now >= factor * ref) or (early > 0 and now >= factor * early)


def _median(x: np.ndarray, size: int) -> float:
    """Median of the finite values of a window of ``size`` steps; NaN when fewer than half are finite."""
    finite = x[np.isfinite(x)]
    return float(np.median(finite)) if len(finite) * 2 >= size else float("nan")


def _direction(now: float, ref: float) -> str:
    """How a median moved against its reference: "rose" / "fell" by more than 10 % of it, else "stayed level"."""
    margin = 0.1 * abs(ref) + 1e-12
    if now > ref + margin:
        return "rose"
    if now < ref - margin:
        return "fell"
    return "stayed level"


def _no_finding(step: int) -> Finding:
    return Finding(None, None, None, "")


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation over the positions where both are finite (0 when undefined)."""
    both = np.isfinite(a) & np.isfinite(b)
    if both.sum() < 3:
        return 0.0
    a, b = a[both] - a[both].mean(), b[both] - b[both].mean()
    denominator = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum()) / denominator if denominator > 0 else 0.0
