"""Each detector fires on its fault at the expected step, stays silent on a clean trace, and
fires again once its cooldown has passed (pure: arrays in, anomalies out)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

from trainvigil.daemon import detectors
from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.batch.from_arrays import Metric, batch_of, chunks, piece, step_columns_of
from trainvigil.daemon.cli.replay import read_recording, replay_table
from trainvigil.daemon.config import load
from trainvigil.daemon.detectors._base import PAGE, WARN, Episodes, Finding
from trainvigil.daemon.detectors._robust import Window, consecutive, fast_median, fast_quantile, robust_z
from trainvigil.daemon.detectors._series import Values
from trainvigil.daemon.detectors._windows import MAX_VALUES, Windows
from trainvigil.schemas import Anomaly, Heartbeat, RunEnd, RunEvent, Source

N = 3000
DATA = Path(__file__).parents[1] / "data"


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def run_detector(
    name: str,
    ranks: Mapping[int, Mapping[str, Metric]],
    *,
    time: Mapping[int, np.ndarray] | None = None,
    chunk: int = 256,
    settings: Mapping[str, object] | None = None,
    extra: Callable[[int, IngestBatch], None] | None = None,
    first: Mapping[int, list[int]] | None = None,
) -> list[Anomaly]:
    """Feed every rank's trace through the detector ``name`` the way live ingest would: in messages of ``chunk``
    steps, but for a rank's first messages, which end at its ``first`` steps (a message cut short)."""
    overrides = {f"detectors.{name}.{k}": v for k, v in (settings or {}).items()}
    (detector,) = [d for d in detectors.build(load(None, overrides, env={}).detectors) if d.name == name]
    parts = {}
    for rank, m in ranks.items():
        part = step_columns_of("run", rank, np.arange(len(next(iter(m.values())))), m, (time or {}).get(rank))
        ends = (first or {}).get(rank, [])
        head = [piece(part, lo, hi) for lo, hi in itertools.pairwise([0, *ends])]
        parts[rank] = head + chunks(piece(part, ends[-1] if ends else 0, len(part)), chunk)
    out: list[Anomaly] = []
    for k in range(max(len(p) for p in parts.values())):
        batch = batch_of(*[p[k] for p in parts.values() if k < len(p)])
        batch.now = max(float(part.times[-1]) for part in batch.steps)
        if extra is not None:
            extra(k, batch)
        out.extend(detector(batch))
    return out


def opened(anomalies: list[Anomaly]) -> list[Anomaly]:
    return [a for a in anomalies if a.state == "open"]


def noisy(seed: int, n: int = N, sigma: float = 0.1, level: float = 1.0) -> np.ndarray:
    return level * np.exp(rng(seed).normal(0, sigma, n))


# ---- shared machinery -------------------------------------------------------------------


def test_window_keeps_only_the_last_values_across_wraparound() -> None:
    w = Window(5)
    w.push(np.arange(3.0))
    w.push(np.arange(3.0, 7.0))
    assert sorted(w.values) == [2.0, 3.0, 4.0, 5.0, 6.0]
    w.push(np.arange(100.0, 110.0))
    assert sorted(w.values) == [105.0, 106.0, 107.0, 108.0, 109.0]


@pytest.mark.parametrize("n", [1, 2, 7, 256, 255])
@pytest.mark.parametrize("q", [0.1, 0.5, 0.9, 0.99])
def test_fast_quantile_equals_numpy(n: int, q: float) -> None:
    values = rng(n).normal(size=n)
    assert fast_quantile(values, q) == pytest.approx(float(np.quantile(values, q)))


@pytest.mark.parametrize("n", [1, 2, 7, 256, 255])
def test_fast_median_equals_numpy(n: int) -> None:
    values = rng(n).normal(size=n)
    assert fast_median(values) == pytest.approx(float(np.median(values)))


def test_consecutive_counts_runs_and_continues_the_carry() -> None:
    flags = np.array([1, 1, 0, 1, 1, 1, 0], dtype=bool)
    assert consecutive(flags, carry=2).tolist() == [3, 4, 0, 1, 2, 3, 0]
    assert consecutive(np.array([1, 1], dtype=bool), carry=3).tolist() == [4, 5]


def test_robust_z_never_judges_a_value_against_itself_and_keeps_outliers_out() -> None:
    w = Window(64)
    x = rng().normal(0, 1, 200)
    x[150] = 50.0
    scored = robust_z(w, x, warmup=32, exclude_z=6, min_scale=1e-3)
    assert np.isnan(scored.z[:16]).all()  # warm-up
    assert scored.z[150] > 20
    assert 50.0 not in w.values


def test_robust_z_fill_block_keeps_a_young_baseline_fresh() -> None:
    """While the window fills, a value is judged against every value up to its ``fill_block``-long block."""
    x = np.arange(100.0)
    stale = robust_z(Window(256), x, warmup=32, exclude_z=np.inf, min_scale=1.0)
    assert stale.median[63] == 15.5  # steps 32-63 are one block, judged against steps 0-31
    fresh = robust_z(Window(256), x, warmup=32, exclude_z=np.inf, min_scale=1.0, fill_block=8)
    assert fresh.median[63] == 27.5  # judged against steps 0-55
    assert np.isnan(fresh.median[:32]).all() and fresh.median[32] == 15.5


def test_episode_opens_escalates_clears_and_rearms() -> None:
    ep = Episodes("demo", cooldown=10)
    key = ("run", 0)
    f = Finding(1.0, 0.5, 0.8, "what to do")
    at = np.arange(100)
    severity = np.zeros(100, dtype=np.int64)
    severity[[20, 22]] = [WARN, PAGE]
    severity[60] = WARN
    out = ep.scan(key, at, severity, at.astype(float), lambda i: f)
    assert [(a.state, a.severity, a.step) for a in out] == [
        ("open", "warn", 20),
        ("escalated", "page", 20),
        ("cleared", "page", 20),
        ("open", "warn", 60),
        ("cleared", "warn", 60),
    ]
    assert out[0].episode == out[1].episode == out[2].episode != out[3].episode
    assert out[2].last_step == 22


def test_detector_settings_come_from_config_and_environment() -> None:
    cfg = load(None, env={"VIGIL_DETECTORS_GRAD_SPIKE_WARN_Z": "4.5"})
    assert cfg.detectors.grad_spike.warn_z == 4.5  # type: ignore[attr-defined]
    assert {d.name for d in detectors.REGISTRY} >= {
        "non_finite",
        "grad_spike",
        "loss_spike",
        "slowdown",
        "straggler",
        "kl_explode",
        "reward_hack",
        "stall",
    }


# ---- non_finite -------------------------------------------------------------------------


def test_non_finite_pages_on_the_same_step_for_each_metric() -> None:
    loss = noisy(1)
    loss[700] = np.nan
    grad = noisy(2)
    grad[1900] = np.inf
    out = opened(run_detector("non_finite", {0: {"loss": loss, "grad_norm": grad}}))
    assert [(a.step, a.severity) for a in out] == [(700, "page"), (1900, "page")]
    assert "loss is nan" in out[0].message and "grad_norm is inf" in out[1].message


def test_non_finite_under_mixed_precision_pages_only_on_three_skipped_steps_in_a_row() -> None:
    grad = noisy(3)
    skipped = np.zeros(N)
    grad[[100, 500, 501]] = np.inf
    skipped[[100, 500, 501]] = 1
    grad[2000:2003] = np.inf
    skipped[2000:2003] = 1
    out = opened(run_detector("non_finite", {0: {"grad_norm": grad, "step_skipped": skipped}}))
    assert [a.step for a in out] == [2002]


def test_non_finite_silent_on_clean_trace() -> None:
    assert run_detector("non_finite", {0: {"loss": noisy(4), "grad_norm": noisy(5)}}) == []


# ---- grad_spike -------------------------------------------------------------------------


def test_grad_spike_pages_on_a_tenfold_spike_at_that_step_and_again_after_cooldown() -> None:
    grad = noisy(6)
    grad[1000] *= 10
    grad[1030] *= 10  # inside the cooldown: the same episode
    grad[1200] *= 100  # after it: a new one
    out = run_detector("grad_spike", {0: {"grad_norm": grad}})
    assert [(a.step, a.severity) for a in opened(out)] == [(1000, "page"), (1200, "page")]
    assert [a.state for a in out].count("cleared") == 2


def test_grad_spike_silent_on_clean_trace_with_drift() -> None:
    grad = np.linspace(5, 0.5, N) * noisy(7)
    assert run_detector("grad_spike", {0: {"grad_norm": grad}}) == []


@pytest.mark.parametrize("batch_steps", [32, 256])
def test_healthy_ddp_run_whose_grad_norm_triples_early_raises_no_alert(batch_steps: int) -> None:
    """A real clean run (``torchrun --nproc_per_node=2 examples/train_ddp.py``, 300 steps, both ranks)
    whose grad norm climbs from ~0.2 to ~2 by step 63: no detector fires, whatever the batch size."""
    table = read_recording(DATA / "ddp_clean_run.csv")
    assert replay_table(table, load(None, env={}), batch_steps=batch_steps) == []


# ---- loss_spike -------------------------------------------------------------------------


def clean_loss(seed: int) -> np.ndarray:
    return np.linspace(3, 1, N) * noisy(seed, sigma=0.05)


def test_loss_spike_transient_persistent_and_divergence() -> None:
    loss = clean_loss(8)
    loss[800] *= 5
    transient = opened(run_detector("loss_spike", {0: {"loss": loss}}))
    assert [(a.step, a.severity) for a in transient] == [(800, "warn")]

    loss = clean_loss(9)
    loss[1500:1600] *= 2.5
    out = run_detector("loss_spike", {0: {"loss": loss}})
    assert any(a.severity == "page" and a.last_step == 1504 for a in out)

    loss = clean_loss(10)
    loss[2500:] *= 40
    out = opened(run_detector("loss_spike", {0: {"loss": loss}}))
    assert [(a.step, a.severity) for a in out] == [(2500, "page")]
    assert "diverging" in out[0].message


def test_loss_spike_silent_on_clean_trace() -> None:
    assert run_detector("loss_spike", {0: {"loss": clean_loss(11)}}) == []


# ---- slowdown and straggler -------------------------------------------------------------


def step_times(seed: int, slow_from: int | None = None, factor: float = 1.3) -> tuple[np.ndarray, np.ndarray]:
    st = noisy(seed, n=6000, sigma=0.1, level=0.5)
    ckpt = np.zeros(6000)
    ckpt[::500] = 1
    st[::500] = 20.0  # checkpoint pauses: excluded
    if slow_from is not None:
        st[slow_from:] *= factor
    return st, ckpt


def test_slowdown_pages_within_two_windows_and_not_before() -> None:
    st, ckpt = step_times(12, slow_from=3000, factor=1.5)
    out = opened(run_detector("slowdown", {0: {"step_time": st, "checkpoint": ckpt}}, time={0: np.cumsum(st)}))
    assert len(out) == 1 and out[0].severity == "page"
    window_steps = int(60 / (0.5 * 1.5)) + 1
    assert out[0].step is not None and 3000 < out[0].step <= 3000 + 3 * window_steps


def test_slowdown_silent_with_checkpoint_pauses() -> None:
    st, ckpt = step_times(13)
    assert run_detector("slowdown", {0: {"step_time": st, "checkpoint": ckpt}}, time={0: np.cumsum(st)}) == []


def _fed(windows: Windows, st: np.ndarray, times: np.ndarray, chunk: int = 4096) -> list[tuple[int, float, float]]:
    steps = np.arange(len(st))
    judged: list[tuple[int, float, float]] = []
    for lo in range(0, len(st), chunk):
        hi = lo + chunk
        judged += windows.feed(Values(steps[lo:hi], st[lo:hi], times[lo:hi]))
    return judged


def test_a_slow_loops_windows_keep_every_value_and_a_fast_loops_a_bounded_sample() -> None:
    slow = noisy(3, n=20_000, sigma=0.1, level=0.5)  # 2 steps a second: every value kept
    whole = Windows(30, 30.0)
    assert _fed(whole, slow, np.cumsum(slow)) == _fed(Windows(30, 30.0), slow, np.cumsum(slow), chunk=7)
    assert whole._stride == 1
    # 40 000 steps a second for 60 s: 2.4 M values; the held history stays near MAX_VALUES per window.
    fast = noisy(4, n=2_400_000, sigma=0.1, level=1 / 40_000)
    windows = Windows(30, 30.0)
    judged = _fed(windows, fast, np.cumsum(fast), chunk=65_536)
    assert len(windows._values) <= 3 * MAX_VALUES and windows._stride > 100
    medians = np.array([m for _, _, m in judged])
    assert len(judged) >= 2 and np.allclose(medians, np.median(fast), rtol=0.02)


def test_slowdown_pages_a_fast_loop_that_slows_down() -> None:
    st = noisy(14, n=1_000_000, sigma=0.1, level=1 / 10_000)  # 10 000 steps a second for ~100 s
    st[600_000:] *= 1.5
    out = opened(run_detector("slowdown", {0: {"step_time": st}}, time={0: np.cumsum(st)}, chunk=16_384))
    assert len(out) == 1 and out[0].severity == "page"
    assert out[0].step is not None and 600_000 < out[0].step <= 600_000 + 2 * 30 * 10_000 / 1.5


def test_straggler_names_the_slow_rank_only() -> None:
    ranks, times = {}, {}
    for r in range(4):
        st, ckpt = step_times(20 + r, slow_from=3000 if r == 2 else None)
        ranks[r], times[r] = {"step_time": st, "checkpoint": ckpt}, np.cumsum(st)
    out = opened(run_detector("straggler", ranks, time=times))
    assert {a.rank for a in out} == {2}
    assert out[0].step is not None and 3000 < out[0].step < 3600 and "rank 2" in out[0].message


def test_straggler_silent_when_every_rank_slows_together() -> None:
    ranks, times = {}, {}
    for r in range(3):
        st, ckpt = step_times(30 + r, slow_from=3000)
        ranks[r], times[r] = {"step_time": st, "checkpoint": ckpt}, np.cumsum(st)
    assert run_detector("straggler", ranks, time=times) == []


def _warm_up_run() -> dict[int, np.ndarray]:
    """Two healthy ranks at ~32 ms a step (the canary's two_rank): both start with two 70 ms steps, and rank 1's
    first 20 steps are 1.3x slower (it warmed up while its neighbours were importing)."""
    ranks = {}
    for r in range(2):
        st = noisy(40 + r, n=300, sigma=0.03, level=0.032)
        st[:2] = 0.07
        if r == 1:
            st[:20] *= 1.3
        ranks[r] = st
    return ranks


def _straggler_fed(first: Mapping[int, list[int]]) -> list[Anomaly]:
    """The warm-up run through ``straggler`` (2 s windows, as in the canary) in messages of 8 steps, but for each
    rank's first messages, which end at its ``first`` steps."""
    ranks = _warm_up_run()
    metrics = {r: {"step_time": st} for r, st in ranks.items()}
    time = {r: np.cumsum(st) for r, st in ranks.items()}
    return run_detector("straggler", metrics, time=time, chunk=8, settings={"min_seconds": 2.0}, first=first)


def test_straggler_windows_do_not_depend_on_how_the_first_steps_were_cut_into_messages() -> None:
    """The run's windows are sized from the first ``min_steps`` step times of a rank, not from its first message:
    an agent that sends its first step or two alone (the slow ones of a warm-up) must not halve the windows, or
    rank 1's slower warm-up fills two of them and is paged as a straggler (the canary's clean two_rank run)."""
    assert _straggler_fed({}) == []
    assert _straggler_fed({0: [2]}) == [], "rank 0's first message held only its two 70 ms steps"
    assert _straggler_fed({0: [1], 1: [2]}) == []


def _two_ranks(slow: slice, factor: float) -> list[Anomaly]:
    """Two ranks at ~32 ms a step through ``straggler`` with 2 s windows (31-step buckets), rank 1's ``slow``
    steps ``factor`` times as long."""
    ranks = {r: noisy(50 + r, n=400, sigma=0.03, level=0.032) for r in range(2)}
    ranks[1][slow] *= factor
    metrics = {r: {"step_time": st} for r, st in ranks.items()}
    time = {r: np.cumsum(st) for r, st in ranks.items()}
    return run_detector("straggler", metrics, time=time, chunk=8, settings={"min_seconds": 2.0})


def test_straggler_leaves_a_ranks_first_bucket_its_warm_up_out_of_every_window() -> None:
    """Rank 1 1.4x slower over its first 40 steps only (the clean canary's rank 1 in CI, 15 % over a dozen):
    its first bucket alone, then the window of its first two, were both slow; no longer judged."""
    assert _two_ranks(slice(0, 40), 1.4) == []
    late = opened(_two_ranks(slice(100, 400), 1.4))  # the same rank slower for good, past its warm-up
    assert [a.rank for a in late] == [1] and late[0].step is not None and 100 < late[0].step < 200


def test_straggler_from_the_first_step_is_still_paged_a_half_window_later() -> None:
    out = opened(_two_ranks(slice(0, 400), 1.5))
    assert [(a.rank, a.severity) for a in out] == [(1, "page")]
    assert out[0].step is not None and out[0].step < 31 * 4, "within two windows after its warm-up"


# ---- kl_explode -------------------------------------------------------------------------


def kl_trace(seed: int, doubling: int | None = None, at: int = 2000) -> np.ndarray:
    kl = np.linspace(0.01, 0.08, N) * noisy(seed, sigma=0.2)
    if doubling:
        kl[at : at + 4 * doubling] *= 2 ** (np.arange(4 * doubling) / doubling)
        kl[at + 4 * doubling :] *= 16
    return kl


def test_kl_explode_rate_rule_fires_soon_after_kl_starts_doubling() -> None:
    out = opened(run_detector("kl_explode", {0: {"kl": kl_trace(40, doubling=5)}}))
    assert len(out) == 1 and out[0].step is not None and 2000 < out[0].step <= 2015


def test_kl_explode_target_rule_and_negative_mean_warning() -> None:
    kl = np.linspace(0.05, 0.3, N)  # too slow for the rate rule; crosses 2x the target
    out = opened(run_detector("kl_explode", {0: {"kl": kl}}, settings={"target": 0.1}))
    first_above = int(np.argmax(kl > 0.2))
    assert [(a.step, a.severity) for a in out] == [(first_above + 2, "page")] and "target" in out[0].message
    negative = opened(run_detector("kl_explode", {0: {"kl": np.full(N, -2.0)}}))
    assert negative and negative[0].severity == "warn" and "estimator" in negative[0].message


def test_kl_explode_silent_on_steady_climb() -> None:
    kl = np.linspace(0.001, 0.5, N) * noisy(41, sigma=0.2)
    assert run_detector("kl_explode", {0: {"kl": kl}}) == []


# ---- reward_hack ------------------------------------------------------------------------


def rl_trace(seed: int, fault: str | None = None) -> dict[str, Metric]:
    g = rng(seed)
    t = np.arange(N)
    reward = 1 - np.exp(-t / 800) + g.normal(0, 0.05, N)
    entropy = 2.0 * np.exp(-t / 3000) * np.exp(g.normal(0, 0.05, N))
    kl = (0.01 + 0.00003 * t) * np.exp(g.normal(0, 0.2, N))
    length = 200 + 0.01 * t + g.normal(0, 10, N)
    if fault == "entropy":
        entropy[2000:] = 0.02
        reward[2000:] += 0.002 * (t[2000:] - 2000)
    if fault == "length":
        length[2000:] *= 2.5
        reward[2000:] += (length[2000:] - 200) / 500
    return {"reward": reward, "entropy": entropy, "kl": kl, "response_len": length}


@pytest.mark.parametrize("fault", ["entropy", "length"])
def test_reward_hack_fires_after_the_fault(fault: str) -> None:
    out = opened(run_detector("reward_hack", {0: rl_trace(50, fault)}))
    assert out and out[0].step is not None and 2000 < out[0].step <= 2100


def test_reward_hack_silent_on_healthy_ppo_run() -> None:
    for seed in range(3):
        assert run_detector("reward_hack", {0: rl_trace(60 + seed)}) == []


# ---- stall ------------------------------------------------------------------------------


def test_stall_pages_when_a_rank_goes_silent_and_clears_when_it_resumes() -> None:
    part = step_columns_of("run", 0, np.arange(100), {"loss": np.ones(100)}, time=np.arange(100.0))
    (stall,) = [d for d in detectors.build(load(None, env={}).detectors) if d.name == "stall"]
    assert stall(batch_of(part, now=100.0)) == []
    assert stall(IngestBatch(now=150.0)) == []  # 50 s: under the 60 s floor
    alert = stall(IngestBatch(now=170.0))
    assert [(a.state, a.step, a.severity) for a in alert] == [("open", 99, "page")]
    assert stall(IngestBatch(now=200.0)) == []  # still the same episode
    resumed = step_columns_of("run", 0, np.arange(100, 110), {"loss": np.ones(10)}, time=np.arange(200.0, 210.0))
    assert [a.state for a in stall(batch_of(resumed, now=210.0))] == ["cleared"]


def test_stall_heartbeats_keep_a_run_alive_and_a_clean_end_never_stalls() -> None:
    (stall,) = [d for d in detectors.build(load(None, env={}).detectors) if d.name == "stall"]
    src = Source(run_id="run", rank=0)
    stall(batch_of(step_columns_of("run", 0, np.arange(10), {"loss": np.ones(10)}, time=np.arange(10.0)), now=10.0))
    for now in (50.0, 100.0, 150.0):
        assert stall(IngestBatch(heartbeats=[(src, Heartbeat(time=now))], now=now)) == []
    assert stall(IngestBatch(run_ends=[(src, RunEnd(time=151.0))], now=151.0)) == []
    assert stall(IngestBatch(now=1000.0)) == []


def test_pause_events_exclude_steps_from_step_time_detectors() -> None:
    st = noisy(70, n=6000, level=0.5)
    st[3000:3100] = 30.0  # a long evaluation, announced by events rather than tags
    events = {3000 + i for i in range(100)}

    def add_events(_k: int, batch: IngestBatch) -> None:
        for part in batch.steps:
            batch.events.extend(
                (part.source, RunEvent(time=0.0, kind="eval", step=int(s))) for s in part.step if int(s) in events
            )

    out = run_detector("slowdown", {0: {"step_time": st}}, time={0: np.cumsum(st)}, extra=add_events)
    assert out == []


def test_a_cleanly_ended_stream_leaves_no_state_behind() -> None:
    ds = detectors.build(load(None, env={}).detectors)
    part = step_columns_of("run", 0, np.arange(300), {"loss": noisy(80, n=300), "grad_norm": noisy(81, n=300)})
    detectors.run_all(ds, batch_of(part))
    stateful = [d for d in ds if isinstance(d, detectors.StreamDetector)]
    assert stateful and all(("run", 0) in d._streams for d in stateful if d.name in ("grad_spike", "loss_spike"))
    detectors.run_all(ds, IngestBatch(run_ends=[(Source(run_id="run", rank=0), RunEnd(time=300.0))]))
    assert all(("run", 0) not in d._streams for d in stateful)


# ---- recovery means recovered --------------------------------------------------------------------


def test_a_loss_that_settles_worse_after_an_lr_jump_stays_open_as_degraded_and_names_the_lr() -> None:
    n, k = 2000, 1000
    loss = noisy(90, n=n, sigma=0.05, level=1.5)
    loss[k : k + 8] *= 20.0  # the blow-up
    loss[k + 8 :] *= 1.7  # then it settles 1.7x worse, for good
    lr = np.full(n, 1e-4)
    lr[k:] = 3e-3  # LR x30 that no schedule explains
    out = run_detector("loss_spike", {0: {"loss": loss, "lr": lr}})
    states = [a.state for a in out]
    assert states[0] == "open" and "degraded" in states and "cleared" not in states, states
    degraded = next(a for a in out if a.state == "degraded")
    assert "not recovered" in degraded.message and "1.7x its level" in degraded.message
    assert "lr went 0.0001 -> 0.003 (30x)" in degraded.message


def test_a_spike_the_run_recovers_from_clears_as_before() -> None:
    n, k = 2000, 1000
    loss = noisy(91, n=n, sigma=0.05, level=1.5)
    loss[k : k + 8] *= 20.0
    out = run_detector("loss_spike", {0: {"loss": loss, "lr": np.full(n, 1e-4)}})
    assert out[0].state == "open" and out[-1].state == "cleared"
    assert all(a.state != "degraded" for a in out)


def test_a_grad_spike_after_a_collapse_states_the_recent_level_not_only_the_old_median() -> None:
    grad = noisy(95, n=1000, sigma=0.1, level=1.4)
    grad[600:] = noisy(96, n=400, sigma=0.1, level=0.005)  # the norms collapse
    grad[640] = 4.99  # then jump back, ~1000x the recent level
    out = opened(run_detector("grad_spike", {0: {"grad_norm": grad}}))
    (spike,) = [a for a in out if a.step == 640]
    assert "last 20 steps ran at ~0.005" in spike.message and "before a level shift" in spike.message
