"""The detector benches' synthetic traces: deterministic per seed, faults where they claim, fed like live ingest."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import feed
import numpy as np
import pytest
import traces


def _same(a: traces.Trace, b: traces.Trace) -> bool:
    return all(
        np.array_equal(ra.time, rb.time)
        and ra.metrics.keys() == rb.metrics.keys()
        and all(np.array_equal(ra.metrics[k], rb.metrics[k], equal_nan=True) for k in ra.metrics)
        for ra, rb in zip(a.ranks, b.ranks, strict=True)
    )


@pytest.mark.parametrize("make", [traces.supervised, traces.rl])
def test_generators_are_deterministic_per_seed(make: Callable[[int, int, int, str], traces.Trace]) -> None:
    """The same seed gives the same trace; another seed a different one."""
    assert _same(make(7, 1500, 2, "a"), make(7, 1500, 2, "a"))
    assert not _same(make(7, 1500, 2, "a"), make(8, 1500, 2, "a"))


def test_supervised_trace_looks_like_training() -> None:
    """Warm-up then decay, loss falling, ranks in lockstep, tagged pauses far slower than steps."""
    t = traces.supervised(3, 6000, 4, "r")
    lr = t.ranks[0].metrics["lr"]
    peak = int(np.argmax(lr))
    assert 0 < peak < 600 and lr[-1] < 0.2 * lr[peak]
    loss = t.ranks[0].metrics["loss"]
    assert np.median(loss[-500:]) < 0.7 * np.median(loss[10:500])
    for r in t.ranks:
        assert np.array_equal(r.time, t.ranks[0].time) and np.all(np.diff(r.time) > 0)
        st = r.metrics["step_time"]
        for tag in ("checkpoint", "eval"):
            tagged = r.present[tag]
            assert tagged.any() and np.all(r.metrics[tag][tagged] == 1)
            assert np.min(st[tagged]) > 3 * np.median(st)


def test_rl_trace_moves_like_ppo() -> None:
    """Reward rises, entropy declines gradually (never collapses), KL climbs."""
    m = traces.rl(5, 3000, 1, "r").ranks[0].metrics
    early, late = slice(0, 200), slice(-200, None)
    assert np.mean(m["reward"][late]) > np.mean(m["reward"][early])
    entropy_ratio = np.median(m["entropy"][late]) / np.median(m["entropy"][early])
    assert 0.2 < entropy_ratio < 1.0
    assert np.median(m["kl"][late]) > 2 * np.median(m["kl"][early])


@pytest.mark.parametrize("kind", traces.FAULTS, ids=lambda k: f"{k.kind}-{k.size}")
def test_fault_lands_where_it_claims(kind: traces.FaultKind) -> None:
    """The first changed value is at the fault's step, only on its ranks, labelled as listed."""
    make, n = (traces.supervised, 3000) if kind.trace == "supervised" else (traces.rl, 1200)
    clean = make(11, n, 4 if kind.kind == "straggler" else 2, "r")
    faulty = traces.inject(clean, kind, np.random.default_rng(0), after=200)
    f = faulty.fault
    assert f is not None
    assert (f.kind, f.size, f.detector) == (kind.kind, kind.size, kind.detector)
    assert f.step >= 200 and f.step + f.horizon < n
    changed: dict[int, int] = {}
    for before, after in zip(clean.ranks, faulty.ranks, strict=True):
        for name, values in after.metrics.items():
            diff = np.flatnonzero(~np.isclose(values, before.metrics[name], equal_nan=True))
            if len(diff):
                changed[after.rank] = min(changed.get(after.rank, n), int(diff[0]))
    assert changed and set(changed) <= set(f.ranks)
    assert min(changed.values()) == f.step
    if f.kind == "stall":
        lo, hi = faulty.silent[0]
        assert lo == faulty.ranks[0].time[f.step - 1] and faulty.ranks[0].time[f.step] > hi


def test_feed_delivers_every_step_once_in_time_order() -> None:
    """Chunks of every rank, ``now`` never goes back, a silence ticks without heartbeats, the run ends."""
    stall = next(k for k in traces.FAULTS if k.kind == "stall")
    t = traces.inject(traces.supervised(2, 3000, 2, "r"), stall, np.random.default_rng(1), after=200)
    batches = list(feed.batches(t, chunk=256))
    nows = [b.now for b in batches]
    assert all(a is not None and b is not None and a <= b for a, b in itertools.pairwise(nows))
    for rank in (0, 1):
        got = np.concatenate([p.step for b in batches for p in b.steps if p.source.rank == rank])
        assert np.array_equal(got, np.arange(3000))
    assert max(len(p) for b in batches for p in b.steps) == 256
    lo, hi = t.silent[0]
    silent = [b for b in batches if b.now is not None and lo < b.now < hi]
    assert silent and all(not b.steps and not b.heartbeats for b in silent)
    ends = [b for b in batches if b.run_ends]
    assert len(ends) == 1 and len(ends[0].run_ends) == 2
