"""Synthetic training traces for the detector benches: clean runs that look like real training, and faults.

A :class:`Trace` is one run: per rank, step numbers, the wall time of each ``log()`` and metric
arrays, exactly what an agent would have sent. Generators are deterministic per seed.

Clean supervised runs (:func:`supervised`): LR linear warm-up then cosine decay to 10 %; loss
falls as a power law of the cumulative learning rate; grad norm starts high, settles, and creeps
up as the LR decays. Every positive metric carries noise in log space: a fast AR(1) with
Student-t innovations (single-step outliers that decay over a few steps) plus a slow Gaussian
AR(1) drift. The tails are set so that a healthy run's grad norm leaves its rolling median by 3x
up to a few times per 100 000 steps and by 6x about once per million (less for the loss).
Step time has its own heavy-tailed jitter, a slow first step (start-up, compile),
a speed factor per rank (±2 %), and periodic checkpoint and eval pauses: those steps carry the
custom metric ``checkpoint=1`` or ``eval=1`` (present on that step only) and last 5 to 120 s.
Ranks run in lockstep: the wall clock advances by the slowest rank's step time, as synchronous
data-parallel training does, while each rank reports its own ``step_time``.

Clean RL runs (:func:`rl`): PPO-like updates of 2 to 20 s: reward rises noisily and saturates,
entropy declines gradually to 30-60 % of its early value, KL to the reference climbs steadily
(a power of time, with noise), response length drifts mildly, value loss decays.

Faults (:func:`inject`): each :class:`Fault` knows its expected detector, the detectors that may
rightly fire too, its first faulty step, the ranks it touches, how many steps after its start a
detection counts, and its latency budget where the issue sets one. ``FAULTS`` lists every kind
and size the evaluation injects.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

HEARTBEAT_S = 5.0
"""The agent's default heartbeat interval."""
WINDOW_S, WINDOW_STEPS = 60.0, 50
"""The slowdown detectors' window: max(50 steps, 60 s)."""
T0 = 1_790_000_000.0
"""Wall time of every trace's first step (late 2026)."""


@dataclass
class RankTrace:
    """One rank's steps: ``metrics`` hold one float per step; a name in ``present`` is sparse."""

    rank: int
    step: np.ndarray
    time: np.ndarray
    metrics: dict[str, np.ndarray]
    present: dict[str, np.ndarray] = field(default_factory=dict)

    def columns(self) -> dict[str, np.ndarray | tuple[np.ndarray, np.ndarray]]:
        """Metrics as :func:`trainvigil.daemon.batch.from_arrays.step_columns_of` takes them."""
        return {k: (v, self.present[k]) if k in self.present else v for k, v in self.metrics.items()}


@dataclass(frozen=True)
class Fault:
    """One injected fault and how a detection of it is judged.

    Attributes:
        step: the first faulty step (for ``stall``: the first step after the silence).
        ranks: the ranks it touches; an alert must name one of them.
        horizon: a detection counts when its episode opens within ``[step, step + horizon]``.
        persistent: the fault lasts to the end of the run (later episodes on its ranks are no
            false alarms).
        budget: the latency target in steps, where the issue sets one.
        lead: a detection may name a step this much before ``step`` (a stall is reported at the
            last step seen before the silence).
    """

    kind: str
    size: str
    detector: str
    step: int
    ranks: tuple[int, ...]
    horizon: int
    persistent: bool = False
    budget: int | None = None
    also: tuple[str, ...] = ()
    lead: int = 0


@dataclass
class Trace:
    run_id: str
    kind: str
    """``supervised`` or ``rl``."""
    seed: int
    ranks: list[RankTrace]
    base_step_time: float
    fault: Fault | None = None
    silent: list[tuple[float, float]] = field(default_factory=list)
    """Wall-time intervals in which the run's agents send nothing at all (not even heartbeats)."""

    @property
    def rows(self) -> int:
        """Step rows over all ranks (the unit of the false-positive rate)."""
        return sum(len(r.step) for r in self.ranks)

    @property
    def length(self) -> int:
        return len(self.ranks[0].step)

    @property
    def window_steps(self) -> int:
        """The slowdown window of this run in steps: max(50 steps, 60 s)."""
        return max(WINDOW_STEPS, math.ceil(WINDOW_S / self.base_step_time))


# ----------------------------------------------------------------------------------------------- noise


def _filter(e: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Causal convolution of ``e`` with ``kernel`` (FFT), same length as ``e``."""
    n = len(e) + len(kernel) - 1
    size = 1 << (n - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(e, size) * np.fft.rfft(kernel, size), size)[: len(e)]


def ar1(rng: np.random.Generator, n: int, phi: float, sd: float, df: float | None = None) -> np.ndarray:
    """Stationary AR(1) noise with marginal standard deviation ``sd``.

    Innovations are Student-t with ``df`` degrees of freedom (scaled to unit variance), or
    Gaussian when ``df`` is None. The recursion runs as a truncated FFT convolution.
    """
    burn = min(math.ceil(math.log(1e-9) / math.log(phi)) if phi > 0 else 1, 20_000)
    e = rng.standard_normal(n + burn) if df is None else rng.standard_t(df, n + burn) * math.sqrt((df - 2) / df)
    e *= sd * math.sqrt(1 - phi * phi)
    return _filter(e, phi ** np.arange(burn))[burn:]


def log_noise(rng: np.random.Generator, n: int, sd: float, df: float, slow_sd: float) -> np.ndarray:
    """Log-space noise: a fast heavy-tailed AR(1) plus a slow Gaussian drift."""
    fast = ar1(rng, n, float(rng.uniform(0.3, 0.7)), sd, df)
    return fast + ar1(rng, n, float(rng.uniform(0.995, 0.999)), slow_sd)


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


# ----------------------------------------------------------------------------------------------- clean runs


def lr_schedule(n: int, peak: float, warmup: int) -> np.ndarray:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then cosine decay to 10 % at step ``n``."""
    t = np.arange(n, dtype=np.float64)
    warm = peak * (t + 1) / warmup
    progress = np.clip((t - warmup) / max(1, n - warmup), 0.0, 1.0)
    decay = peak * (0.1 + 0.9 * 0.5 * (1 + np.cos(math.pi * progress)))
    return np.where(t < warmup, warm, decay)


def _pauses(rng: np.random.Generator, n: int, every: int, lo_s: float, hi_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(tag mask, pause seconds) for a pause every ``every`` steps, at a random phase."""
    tag = np.zeros(n, dtype=bool)
    tag[int(rng.integers(every // 2, every)) :: every] = True
    seconds = np.where(tag, rng.uniform(lo_s, hi_s, n), 0.0)
    return tag, seconds


def _step_times(
    rng: np.random.Generator, n: int, ranks: int, base: float, pause_s: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank step times (ranks x n) and the lockstep wall clock at each step's ``log()``."""
    speed = 1.0 + rng.normal(0.0, 0.02, ranks)
    shared = log_noise(rng, n, 0.01, 5.0, 0.01)  # the cluster's common variation (I/O, network)
    times = np.empty((ranks, n))
    for r in range(ranks):
        jitter = log_noise(rng, n, float(rng.uniform(0.01, 0.04)), float(rng.uniform(3.0, 5.0)), 0.005)
        times[r] = base * speed[r] * np.exp(shared + jitter)
    times[:, 0] *= rng.uniform(5.0, 30.0)  # start-up: CUDA context, compilation
    times += pause_s
    return times, clock(times)


def clock(step_time: np.ndarray) -> np.ndarray:
    """Lockstep wall clock: each step ends when the slowest rank is done (ranks x n)."""
    wall = T0 + np.cumsum(step_time.max(axis=0))
    return np.broadcast_to(wall, step_time.shape).copy()


def supervised(seed: int, n: int, ranks: int, run_id: str) -> Trace:
    """A clean supervised run of ``n`` steps on ``ranks`` ranks."""
    rng = np.random.default_rng(seed)
    base = _loguniform(rng, 0.2, 2.0)
    warmup = int(rng.integers(max(10, n // 100), max(11, n // 20)))
    lr = lr_schedule(n, _loguniform(rng, 1e-4, 3e-3), warmup)
    progress = np.cumsum(lr) / lr.sum()
    l0, l_end = float(rng.uniform(2.0, 11.0)), float(rng.uniform(0.15, 0.5))
    loss_trend = np.log(l0 * l_end + l0 * (1 - l_end) * (1 + 30 * progress) ** -0.8)
    t = np.arange(n, dtype=np.float64)
    g_inf = _loguniform(rng, 0.2, 5.0)
    grad_trend = np.log(g_inf * (1 + 4 * np.exp(-t / max(warmup, 10))) * (1 + 0.3 * t / n))
    ckpt, ckpt_s = _pauses(rng, n, int(rng.integers(500, 2000)), 10.0, 120.0)
    evals, eval_s = _pauses(rng, n, int(rng.integers(200, 1000)), 5.0, 60.0)
    evals &= ~ckpt
    step_time, wall = _step_times(rng, n, ranks, base, np.where(ckpt, ckpt_s, np.where(evals, eval_s, 0.0)))
    samples = float(rng.choice([32, 64, 128, 256, 512]))
    seq = float(rng.choice([512, 1024, 2048, 4096]))
    loss_sd, loss_df = float(rng.uniform(0.02, 0.06)), float(rng.uniform(4.0, 8.0))
    grad_sd, grad_df = float(rng.uniform(0.06, 0.15)), float(rng.uniform(5.0, 10.0))
    out = []
    for r in range(ranks):
        loss = np.exp(loss_trend + log_noise(rng, n, loss_sd, loss_df, 0.02))
        grad = np.exp(grad_trend + log_noise(rng, n, grad_sd, grad_df, 0.05))
        metrics = {
            "loss": loss,
            "grad_norm": grad,
            "lr": lr,
            "step_time": step_time[r],
            "samples": np.full(n, samples),
            "tokens": np.full(n, samples * seq),
            "checkpoint": ckpt.astype(np.float64),
            "eval": evals.astype(np.float64),
        }
        out.append(RankTrace(r, np.arange(n, dtype=np.int64), wall[r], metrics, {"checkpoint": ckpt, "eval": evals}))
    return Trace(run_id, "supervised", seed, out, base)


def rl(seed: int, n: int, ranks: int, run_id: str) -> Trace:
    """A clean PPO-like run of ``n`` updates on ``ranks`` ranks."""
    rng = np.random.default_rng(seed)
    base = _loguniform(rng, 2.0, 20.0)
    t = np.arange(n, dtype=np.float64)
    lr = lr_schedule(n, _loguniform(rng, 1e-6, 1e-5), int(rng.integers(5, 50)))
    r0, r_max = float(rng.uniform(-1.0, 0.2)), float(rng.uniform(0.5, 2.0))
    tau_r = float(rng.uniform(0.15, 0.5)) * n
    reward_trend = r0 + (r_max - r0) * (1 - np.exp(-t / tau_r))
    e0, floor = float(rng.uniform(0.5, 3.0)), float(rng.uniform(0.3, 0.6))
    entropy_trend = np.log(e0 * (floor + (1 - floor) * np.exp(-t / (float(rng.uniform(0.2, 0.6)) * n))))
    kl_end, t_kl = _loguniform(rng, 0.02, 0.5), float(rng.uniform(50.0, 200.0))
    kl_trend = np.log(kl_end * ((t + t_kl) / (n + t_kl)) ** float(rng.uniform(0.7, 1.3)))
    len0, drift = float(rng.uniform(100.0, 800.0)), float(rng.uniform(-0.2, 0.3))
    len_trend = np.log(len0 * (1 + drift * t / n))
    loss_trend = np.log(_loguniform(rng, 0.05, 1.0) * (0.3 + 0.7 * np.exp(-t / (0.3 * n))))
    grad_trend = np.log(_loguniform(rng, 0.1, 2.0)) + np.zeros(n)
    step_time, wall = _step_times(rng, n, ranks, base, np.zeros(n))
    reward_sd = 0.08 * (r_max - r0)
    out = []
    for r in range(ranks):
        reward_noise = ar1(rng, n, float(rng.uniform(0.3, 0.7)), reward_sd, float(rng.uniform(4.0, 8.0)))
        metrics = {
            "reward": reward_trend + reward_noise,
            "entropy": np.exp(entropy_trend + log_noise(rng, n, 0.03, 6.0, 0.02)),
            "kl": np.exp(kl_trend + log_noise(rng, n, float(rng.uniform(0.05, 0.15)), 6.0, 0.05)),
            "response_len": np.exp(len_trend + log_noise(rng, n, 0.04, 6.0, 0.02)),
            "loss": np.exp(loss_trend + log_noise(rng, n, 0.1, 5.0, 0.05)),
            "grad_norm": np.exp(grad_trend + log_noise(rng, n, float(rng.uniform(0.06, 0.15)), 6.0, 0.05)),
            "lr": lr,
            "step_time": step_time[r],
        }
        out.append(RankTrace(r, np.arange(n, dtype=np.int64), wall[r], metrics))
    return Trace(run_id, "rl", seed, out, base)


# ----------------------------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class FaultKind:
    """A fault kind at one size: what trace it needs, and how to put it in."""

    kind: str
    size: str
    detector: str
    trace: str
    """``supervised`` or ``rl``."""
    apply: Callable[[Trace, int, np.random.Generator], Fault]


def _one_rank(trace: Trace, rng: np.random.Generator) -> int:
    return int(rng.integers(len(trace.ranks)))


def _all(trace: Trace) -> tuple[int, ...]:
    return tuple(r.rank for r in trace.ranks)


def _retime(trace: Trace) -> None:
    """Recompute the lockstep wall clock after step times changed."""
    wall = clock(np.stack([r.metrics["step_time"] for r in trace.ranks]))
    for r, w in zip(trace.ranks, wall, strict=True):
        r.time = w


def grad_spike(factor: float) -> Callable[[Trace, int, np.random.Generator], Fault]:
    def apply(trace: Trace, at: int, rng: np.random.Generator) -> Fault:
        r = _one_rank(trace, rng)
        trace.ranks[r].metrics["grad_norm"][at] *= factor
        budget = 1 if factor >= 10 else None
        return Fault("grad_spike", f"x{factor:g}", "grad_spike", at, (r,), 10, budget=budget)

    return apply


def non_finite(metric: str, value: float) -> Callable[[Trace, int, np.random.Generator], Fault]:
    def apply(trace: Trace, at: int, rng: np.random.Generator) -> Fault:
        r = _one_rank(trace, rng)
        trace.ranks[r].metrics[metric][at] = value
        return Fault("non_finite", f"{metric}={value}", "non_finite", at, (r,), 5, budget=0)

    return apply


def loss_spike(factor: float, steps: int) -> Callable[[Trace, int, np.random.Generator], Fault]:
    def apply(trace: Trace, at: int, rng: np.random.Generator) -> Fault:
        r = _one_rank(trace, rng)
        trace.ranks[r].metrics["loss"][at : at + steps] *= factor
        return Fault("loss_spike", f"x{factor:g} {steps} step{'s' * (steps > 1)}", "loss_spike", at, (r,), steps + 10)

    return apply


def divergence(steps_to_10x: int) -> Callable[[Trace, int, np.random.Generator], Fault]:
    """Loss grows exponentially on every rank: x10 after ``steps_to_10x`` steps (capped at x1e4)."""

    def apply(trace: Trace, at: int, rng: np.random.Generator) -> Fault:
        growth = np.minimum(10.0 ** (np.arange(1, trace.length - at + 1) / steps_to_10x), 1e4)
        for r in trace.ranks:
            r.metrics["loss"][at:] *= growth
        size = f"x10 in {steps_to_10x}"
        return Fault("divergence", size, "loss_spike", at, _all(trace), 4 * steps_to_10x, persistent=True)

    return apply


def slowdown(factor: float, one_rank: bool) -> Callable[[Trace, int, np.random.Generator], Fault]:
    """Step time x``factor`` from the fault step on, on every rank or (straggler) on one."""

    def apply(trace: Trace, at: int, rng: np.random.Generator) -> Fault:
        ranks = (_one_rank(trace, rng),) if one_rank else _all(trace)
        for r in ranks:
            trace.ranks[r].metrics["step_time"][at:] *= factor
        _retime(trace)
        window = trace.window_steps
        budget = 2 * window if factor >= 1.3 else None
        kind = "straggler" if one_rank else "slowdown"
        also = ("slowdown",) if one_rank else ()
        return Fault(kind, f"{factor:g}x", kind, at, ranks, 6 * window, persistent=True, budget=budget, also=also)

    return apply


def stall(seconds: float) -> Callable[[Trace, int, np.random.Generator], Fault]:
    """Every rank goes silent (no steps, no heartbeats) for ``seconds`` before the fault step."""

    def apply(trace: Trace, at: int, rng: np.random.Generator) -> Fault:
        for r in trace.ranks:
            r.metrics["step_time"][at] += seconds  # step time is measured between step boundaries
        _retime(trace)
        last = float(trace.ranks[0].time[at - 1])
        trace.silent.append((last, last + seconds))
        # Silent past run_failed's lost_after_s (10 min), a rank is presumed dead: that page is no false alarm.
        also = ("run_failed",) if seconds > 600.0 else ()
        return Fault("stall", f"{seconds / 60:g} min", "stall", at, _all(trace), 1, also=also, lead=1)

    return apply


def kl_explode(doubling_steps: int) -> Callable[[Trace, int, np.random.Generator], Fault]:
    """KL doubles every ``doubling_steps`` steps from the fault step on (capped at x1000)."""

    def apply(trace: Trace, at: int, rng: np.random.Generator) -> Fault:
        growth = np.minimum(2.0 ** (np.arange(1, trace.length - at + 1) / doubling_steps), 1e3)
        for r in trace.ranks:
            r.metrics["kl"][at:] *= growth
        return Fault("kl_explode", f"x2 in {doubling_steps}", "kl_explode", at, _all(trace), 100, persistent=True)

    return apply


def entropy_collapse(steps_to_tenth: int) -> Callable[[Trace, int, np.random.Generator], Fault]:
    """Entropy falls to 0.1x in ``steps_to_tenth`` steps (floor 0.02x) while reward climbs faster."""

    def apply(trace: Trace, at: int, rng: np.random.Generator) -> Fault:
        k = np.arange(1, trace.length - at + 1, dtype=np.float64)  # the fault step itself is faulty
        collapse = np.maximum(10.0 ** (-k / steps_to_tenth), 0.02)
        for r in trace.ranks:
            reward = r.metrics["reward"]
            gain = 0.5 * (float(np.ptp(reward[:at])) + 0.1)
            r.metrics["entropy"][at:] *= collapse
            reward[at:] += gain * (1 - np.exp(-k / steps_to_tenth))
        size = f"0.1x in {steps_to_tenth}"
        return Fault("entropy_collapse", size, "reward_hack", at, _all(trace), 3 * steps_to_tenth + 50, persistent=True)

    return apply


def length_exploit(factor: float) -> Callable[[Trace, int, np.random.Generator], Fault]:
    """Response length grows to ``factor``x over 100 steps and reward follows it."""

    def apply(trace: Trace, at: int, rng: np.random.Generator) -> Fault:
        k = np.arange(1, trace.length - at + 1, dtype=np.float64)  # the fault step itself is faulty
        grow = 1 + (factor - 1) * np.minimum(1.0, k / 100)
        for r in trace.ranks:
            length, reward = r.metrics["response_len"], r.metrics["reward"]
            spread = float(np.ptp(reward[:at])) + 0.1
            length[at:] *= grow
            reward[at:] += 0.5 * spread * (length[at:] / np.median(length[:at]) - 1) / (factor - 1)
        return Fault("length_exploit", f"{factor:g}x", "reward_hack", at, _all(trace), 300, persistent=True)

    return apply


def _kinds() -> list[FaultKind]:
    s, r = "supervised", "rl"
    out = [FaultKind("grad_spike", f"x{f:g}", "grad_spike", s, grad_spike(f)) for f in (3.0, 10.0, 100.0)]
    out += [
        FaultKind("non_finite", f"{m}={v}", "non_finite", s, non_finite(m, v))
        for m, v in (("loss", math.nan), ("grad_norm", math.nan), ("grad_norm", math.inf))
    ]
    out.append(FaultKind("non_finite", "kl=nan", "non_finite", r, non_finite("kl", math.nan)))
    out += [
        FaultKind("loss_spike", f"x{f:g} {n} step{'s' * (n > 1)}", "loss_spike", s, loss_spike(f, n))
        for f, n in ((2.0, 1), (5.0, 1), (3.0, 20))
    ]
    out += [FaultKind("divergence", f"x10 in {n}", "loss_spike", s, divergence(n)) for n in (20, 200)]
    for kind, one in (("slowdown", False), ("straggler", True)):
        out += [FaultKind(kind, f"{f:g}x", kind, s, slowdown(f, one)) for f in (1.1, 1.3, 1.5, 2.0)]
    out += [FaultKind("stall", f"{m:g} min", "stall", s, stall(60.0 * m)) for m in (10, 30)]
    out += [FaultKind("kl_explode", f"x2 in {n}", "kl_explode", r, kl_explode(n)) for n in (5, 10, 20)]
    out += [FaultKind("entropy_collapse", f"0.1x in {n}", "reward_hack", r, entropy_collapse(n)) for n in (50, 200)]
    out += [FaultKind("length_exploit", f"{f:g}x", "reward_hack", r, length_exploit(f)) for f in (2.0, 3.0)]
    return out


FAULTS: list[FaultKind] = _kinds()
"""Every fault kind and size the evaluation injects."""


def inject(trace: Trace, fault: FaultKind, rng: np.random.Generator, *, after: int) -> Trace:
    """A copy of ``trace`` with ``fault`` at a random step in ``[after, length - room)``.

    ``room`` leaves the fault's whole horizon inside the trace (the horizon is known once the
    fault is in, so the position is drawn against a generous bound and checked).
    """
    out = copy.deepcopy(trace)
    room = max(900, 7 * trace.window_steps) if fault.trace == "supervised" else 700
    if trace.length - room <= after:
        raise ValueError(f"trace of {trace.length} steps is too short for {fault.kind} after step {after}")
    at = int(rng.integers(after, trace.length - room))
    placed = fault.apply(out, at, rng)
    if placed.step + placed.horizon >= trace.length:
        raise ValueError(f"{fault.kind} {fault.size}: horizon {placed.horizon} runs past the trace")
    out.fault = placed
    out.run_id = f"{trace.run_id}-{fault.kind}-{fault.size}".replace(" ", "_")
    return out
