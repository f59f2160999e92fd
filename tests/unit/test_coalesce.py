"""A busy fleet's small step chunks are held back from the per-step detectors (``detectors._coalesce``):
the same episodes come out, a NaN still pages with its own batch, and nothing stays held once the
rush is over or a run ends (pure: batches in, alerts out)."""

from __future__ import annotations

import numpy as np

from trainvigil.daemon import detectors
from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.batch.from_arrays import step_columns_of
from trainvigil.daemon.config import load
from trainvigil.daemon.detectors import Detectors, run_all
from trainvigil.schemas import Anomaly, RunEnd, Source

RANKS, PER_MESSAGE, SECONDS = 96, 4, 120
SPIKE = (17, 300)
"""(rank, step) of a grad-norm spike x50 in run ``fleet``."""


def _fleet(seconds: int = SECONDS, nan_at: tuple[int, int] | None = None) -> list[IngestBatch]:
    """``RANKS`` ranks of one run, each sending 4 steps a second, one batch a second; a slow rank 5."""
    rng = np.random.default_rng(7)
    batches = []
    for second in range(seconds):
        batch = IngestBatch(now=1_000.0 + second, messages=RANKS)
        for rank in range(RANKS):
            step = np.arange(second * PER_MESSAGE, (second + 1) * PER_MESSAGE)
            grad = np.exp(rng.normal(0.0, 0.1, PER_MESSAGE))
            loss = 2.0 * np.exp(-step / 400) * np.exp(rng.normal(0.0, 0.02, PER_MESSAGE))
            pace = 0.3 if rank == 5 else 0.2
            if (rank, *SPIKE[1:]) == (SPIKE[0], *SPIKE[1:]) and SPIKE[1] in step:
                grad[step.tolist().index(SPIKE[1])] *= 50
            if nan_at is not None and rank == nan_at[0] and nan_at[1] in step:
                loss[step.tolist().index(nan_at[1])] = np.nan
            metrics = {"grad_norm": grad, "loss": loss, "step_time": np.full(PER_MESSAGE, pace)}
            batch.steps.append(step_columns_of("fleet", rank, step, metrics, step * pace))
        batches.append(batch)
    return batches


def _build(min_streams: int) -> Detectors:
    dets = detectors.build(load(None, env={}).detectors)
    dets.held.min_streams = min_streams
    return dets


def _episodes(found: list[Anomaly]) -> set[tuple[str, int, int | None, str, str]]:
    return {(a.detector, a.rank, a.step, a.state, a.severity) for a in found if a.detector != "stall"}


def test_held_steps_give_the_episodes_judging_every_batch_gives() -> None:
    eager, coalesced = _build(min_streams=10**9), _build(min_streams=64)
    eager_found = [a for batch in _fleet() for a in run_all(eager, batch)]
    coalesced_found = [a for batch in _fleet() for a in run_all(coalesced, batch)]
    assert ("grad_spike", SPIKE[0], SPIKE[1], "open", "page") in _episodes(eager_found), "the spike pages"
    assert any(a.detector == "straggler" and a.rank == 5 for a in eager_found), "the slow rank is named"
    assert _episodes(coalesced_found) == _episodes(eager_found)


def test_a_busy_batch_holds_small_chunks_until_enough_steps_or_time() -> None:
    dets = _build(min_streams=64)
    batches = _fleet(seconds=12)
    run_all(dets, batches[0])
    assert len(dets.held) == RANKS, "4 fresh steps of each of 96 streams: held"
    grad = next(d for d in dets if d.name == "grad_spike")
    assert grad.tracked() == 0, "grad_spike has seen none of them yet"
    for batch in batches[1:5]:
        run_all(dets, batch)
    assert len(dets.held) == RANKS and grad.tracked() == 0, "20 steps over 4 s: still held"
    # 32 steps (8 messages) or 5 s, whichever first: the 5 s come first.
    run_all(dets, batches[5])
    assert len(dets.held) == 0 and grad.tracked() == RANKS, "5 s: released with the batch's own steps"
    run_all(dets, batches[6])
    assert len(dets.held) == RANKS, "and held again"
    quiet = IngestBatch(now=batches[-1].now)
    run_all(dets, quiet)
    assert len(dets.held) == 0, "a batch that is not busy lets every held step go"


def test_a_nan_pages_with_the_batch_that_carries_it_while_others_wait() -> None:
    dets = _build(min_streams=64)
    batches = _fleet(seconds=10, nan_at=(40, 26))
    for second, batch in enumerate(batches):
        found = run_all(dets, batch)
        if second == 26 // PER_MESSAGE:
            assert [(a.detector, a.rank, a.step) for a in found if a.state == "open"] == [("non_finite", 40, 26)]
            assert len(dets.held) > 0, "the other detectors' steps were held in the same batch"


def test_a_run_end_lets_its_held_steps_go_to_be_judged() -> None:
    dets = _build(min_streams=64)
    first, second = _fleet(seconds=2)
    run_all(dets, first)
    assert len(dets.held) == RANKS
    second.run_ends = [(Source(run_id="fleet", rank=rank), RunEnd(time=second.now or 0.0)) for rank in range(RANKS)]
    run_all(dets, second)
    assert len(dets.held) == 0
    assert all(d.tracked() == 0 for d in dets), "judged, then forgotten with the run"


def test_replay_holds_nothing() -> None:
    dets = _build(min_streams=0)
    for batch in _fleet(seconds=3):
        batch.now = None
        run_all(dets, batch)
        assert len(dets.held) == 0


def test_released_steps_are_judged_whatever_else_the_batch_holds() -> None:
    """A quiet batch of as many empty parts as there are held streams releases them all to the detectors
    (a count of parts once stood for "nothing released" and let them go unjudged)."""
    dets = _build(min_streams=64)
    first = _fleet(seconds=1)[0]
    run_all(dets, first)
    assert len(dets.held) == RANKS
    empty = [step_columns_of("other", rank, np.empty(0, dtype=np.int64), {}) for rank in range(RANKS)]
    run_all(dets, IngestBatch(now=(first.now or 0.0) + 1, steps=empty))
    grad = next(d for d in dets if d.name == "grad_spike")
    assert len(dets.held) == 0 and grad.tracked() == RANKS
