"""``reward_hack`` pages a collapsing held-out return whatever the training reward does.

Judged on a recorded real PPO run whose reward function is swapped for a flawed one (the corpus'
``ppo-cartpole-reward-swap``: the logged training reward changes scale at the swap and then creeps,
the true return collapses), replayed as live ingest feeds the detectors, and on plain series: a
held-out return collapsing while the training reward rises, stays level or falls; a noisy steady one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from trainvigil.daemon import detectors
from trainvigil.daemon.batch.from_arrays import batch_of, step_columns_of
from trainvigil.daemon.cli.replay import replay_table
from trainvigil.daemon.config import load
from trainvigil.schemas import Anomaly

CORPUS = Path(__file__).parents[1] / "data" / "corpus"
SWAP = "ppo-cartpole-reward-swap"
WITHIN = 40
"""Updates from the collapse (the true return below half its level before the fault) to the page."""
REWARD_SAID = re.compile(r"while the training reward (rose|stayed level|fell) -?[\d.e+]+ -> -?[\d.e+]+")


def _collapse_step(name: str) -> tuple[int, int]:
    """The fault step and the first update after it whose true return is below half its median before it."""
    fault = int(json.loads((CORPUS / name / "manifest.json").read_text())["fault"]["step"])
    table = pq.read_table(CORPUS / name / "steps.parquet", columns=["step", "true_return"])
    steps, returns = table["step"].to_numpy(), table["true_return"].to_numpy(zero_copy_only=False)
    before = float(np.nanmedian(returns[(steps >= fault - 80) & (steps < fault)]))
    after = np.flatnonzero((steps >= fault) & (returns < 0.5 * before))
    return fault, int(steps[after[0]])


def test_a_real_held_out_collapse_under_a_swapped_reward_pages_soon_and_says_what_the_reward_did() -> None:
    fault, collapse = _collapse_step(SWAP)
    assert fault < collapse, "the recorded run collapses after its swap"
    found = [a for a in replay_table(pq.read_table(CORPUS / SWAP / "steps.parquet")) if a.detector == "reward_hack"]
    pages = [a for a in found if a.state == "open" and a.severity == "page" and (a.step or 0) >= fault]
    assert pages, "the collapse was not paged"
    first = pages[0]
    assert first.step is not None and first.step - collapse <= WITHIN, (collapse, first.step, first.message)
    assert "held-out return collapsed" in first.message
    assert REWARD_SAID.search(first.message), first.message


def test_the_collapse_episode_stays_open_while_the_held_out_return_stays_down() -> None:
    """The run never recovers (its true return stays at ~40 against ~500): an all-clear would be wrong."""
    found = [a for a in replay_table(pq.read_table(CORPUS / SWAP / "steps.parquet")) if a.detector == "reward_hack"]
    assert found
    assert [a.state for a in found if a.state == "cleared"] == [], [(a.step, a.message[:100]) for a in found]


def _reward_hack() -> detectors.Detector:
    (det,) = [d for d in detectors.build(load(None, env={}).detectors) if d.name == "reward_hack"]
    return det


def _run(true_return: np.ndarray, reward: np.ndarray, seed: int = 0) -> list[Anomaly]:
    """One PPO-like stream (entropy steady), fed in batches of 64 updates as live ingest would."""
    det = _reward_hack()
    rng = np.random.default_rng(seed)
    n = len(true_return)
    entropy = 0.5 * np.exp(rng.normal(0, 0.05, n))
    kl = 1e-3 * np.exp(rng.normal(0, 0.3, n))
    out: list[Anomaly] = []
    for a in range(0, n, 64):
        s = slice(a, min(n, a + 64))
        steps = np.arange(s.start, s.stop)
        metrics = {"reward": reward[s], "true_return": true_return[s], "entropy": entropy[s], "kl": kl[s]}
        part = step_columns_of("run", 0, steps, metrics, time=steps.astype(float))
        out += det(batch_of(part, now=float(steps[-1])))
    return out


N, AT = 500, 300


def _collapsing(rng: np.random.Generator) -> np.ndarray:
    """A held-out return of ~200 that falls to ~15 over 40 updates from ``AT`` and stays there."""
    level = np.full(N, 200.0)
    level[AT : AT + 40] = np.linspace(200.0, 15.0, 40)
    level[AT + 40 :] = 15.0
    return level * np.exp(rng.normal(0, 0.1, N))


@pytest.mark.parametrize(
    ("moved", "after"),
    [("rose", lambda t: 1.0 + 0.01 * t), ("stayed level", lambda t: np.ones_like(t)), ("fell", lambda t: 0.6 + 0 * t)],
)
def test_a_collapsing_held_out_return_pages_whatever_the_training_reward_does(moved: str, after: object) -> None:
    rng = np.random.default_rng(1)
    reward = np.ones(N)
    t = np.arange(N - AT, dtype=float)
    reward[AT:] = after(t)  # type: ignore[operator]
    reward *= np.exp(rng.normal(0, 0.02, N))
    out = _run(_collapsing(rng), reward)
    pages = [a for a in out if a.state == "open" and a.severity == "page"]
    assert len(pages) == 1, [(a.step, a.message[:80]) for a in out]
    assert pages[0].step is not None and AT <= pages[0].step <= AT + 60
    said = REWARD_SAID.search(pages[0].message)
    assert said is not None and said.group(1) == moved, pages[0].message
    assert [a for a in out if a.state == "cleared"] == [], "the return never came back"


def test_a_noisy_but_steady_held_out_return_does_not_page() -> None:
    for seed in range(5):
        rng = np.random.default_rng(10 + seed)
        # Heavy noise and slow swings (a CartPole-like return), never a sustained collapse.
        swing = 1 + 0.3 * np.sin(np.arange(N) / 40.0)
        true_return = 200 * swing * np.exp(rng.normal(0, 0.35, N))
        reward = np.exp(rng.normal(0, 0.05, N))
        assert _run(true_return, reward, seed) == [], seed


def test_a_held_out_return_that_comes_back_clears_the_episode() -> None:
    rng = np.random.default_rng(2)
    level = _collapsing(rng)
    level[AT + 80 :] = 200 * np.exp(rng.normal(0, 0.1, N - AT - 80))
    out = _run(level, np.ones(N))
    assert [a.state for a in out] == ["open", "cleared"], [(a.state, a.step, a.message[:80]) for a in out]
