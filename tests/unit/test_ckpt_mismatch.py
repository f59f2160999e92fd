"""The ``ckpt_mismatch`` detector on plain batches (no broker): majority, waiting, save vs load, memory."""

from __future__ import annotations

from typing import Literal

from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.detectors.ckpt_mismatch import CkptMismatch, CkptMismatchSettings
from trainvigil.schemas import Anomaly, CheckpointDigest, Source


def _parity(run: str, rank: int, step: int, root: str, world: int = 3) -> tuple[Source, CheckpointDigest]:
    tensors = {"a.weight": "same", "b.weight": root}
    return Source(run_id=run, rank=rank, world_size=world), CheckpointDigest(
        time=float(step), step=step, algo="blake3", root=root, tensors=tensors, origin="parity"
    )


def _batch(*records: tuple[Source, CheckpointDigest]) -> IngestBatch:
    return IngestBatch(checkpoints=list(records), now=100.0)


def test_majority_names_the_odd_rank_even_when_it_is_rank_0() -> None:
    det = CkptMismatch(CkptMismatchSettings())
    assert det(_batch(*(_parity("r", k, 0, "x") for k in range(3)))) == []
    out = det(_batch(_parity("r", 0, 5, "odd"), _parity("r", 1, 5, "y"), _parity("r", 2, 5, "y")))
    assert [(a.rank, a.step, a.state, a.severity) for a in out] == [(0, 5, "open", "page")]
    assert "2 of 3 ranks agree" in out[0].message and "b.weight" in out[0].message
    assert "a.weight" not in out[0].message
    again = det(_batch(_parity("r", 0, 10, "odd2"), _parity("r", 1, 10, "z"), _parity("r", 2, 10, "z")))
    assert again == [], "the same incident stays one episode"


def test_waits_for_every_rank_then_judges_after_later_rounds_without_the_missing_one() -> None:
    det = CkptMismatch(CkptMismatchSettings(wait_rounds=2))
    assert det(_batch(_parity("r", 0, 5, "y"), _parity("r", 1, 5, "odd"))) == [], "rank 2 not in yet"
    assert det(_batch(_parity("r", 0, 10, "a"), _parity("r", 1, 10, "a"))) == []
    out = det(_batch(_parity("r", 0, 15, "b"), _parity("r", 1, 15, "b")))
    assert [(a.rank, a.step) for a in out] == [(1, 5)], "two later rounds: step 5 judged with ranks 0 and 1"
    assert "no majority" in out[0].message and "rank 0 is the reference" in out[0].message
    assert det(_batch(_parity("r", 2, 5, "late"))) == [], "a report for a judged step is ignored"


def test_pending_steps_are_bounded() -> None:
    det = CkptMismatch(CkptMismatchSettings(max_pending_steps=4, wait_rounds=10**6))
    for step in range(100):
        det(_batch(_parity("r", 0, step, "x")))
    assert len(det._parity["r"]) <= 4


def _ckpt(
    origin: Literal["save", "load", "parity"], root: str, ok: bool = True, rank: int = 0, t: float = 1.0
) -> tuple[Source, CheckpointDigest]:
    return Source(run_id="r", rank=rank), CheckpointDigest(
        time=t, step=7, algo="blake3", root=root, tensors={"w": root}, path="/c/model.pt", origin=origin, ok=ok
    )


def test_load_that_differs_from_the_save_of_the_same_path_pages_and_a_clean_load_clears() -> None:
    det = CkptMismatch(CkptMismatchSettings())
    assert det(_batch(_ckpt("save", "good"))) == []
    assert det(_batch(_ckpt("load", "good", t=2.0))) == []
    out = det(_batch(_ckpt("load", "bad", rank=1, t=3.0)))
    assert [(a.rank, a.severity, a.state) for a in out] == [(1, "page", "open")]
    assert "/c/model.pt" in out[0].message and "save-time digest" in out[0].message and "w" in out[0].message
    cleared = det(_batch(_ckpt("load", "good", rank=1, t=4.0)))
    assert [a.state for a in cleared] == ["cleared"]


def test_load_the_agent_found_corrupt_pages_without_a_known_save() -> None:
    det = CkptMismatch(CkptMismatchSettings())
    out = det(_batch(_ckpt("load", "whatever", ok=False)))
    assert [(a.severity, a.step) for a in out] == [("page", 7)] and "its manifest" in out[0].message


def test_a_rank_that_ends_first_is_not_paged_again_by_digests_that_arrive_after_its_end() -> None:
    """Under load rank 1's run_end can be ingested before rank 0's later parity digests: still one page."""
    from trainvigil.daemon import detectors
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.daemon.detectors import run_all
    from trainvigil.schemas import RunEnd

    dets = detectors.build(DaemonConfig().detectors)
    pages: list[Anomaly] = []

    def feed(batch: IngestBatch) -> None:
        pages.extend(a for a in run_all(dets, batch) if a.detector == "ckpt_mismatch" and a.state == "open")

    feed(_batch(_parity("d", 0, 10, "x", world=2), _parity("d", 1, 10, "x", world=2)))
    feed(_batch(_parity("d", 0, 15, "y", world=2), _parity("d", 1, 15, "odd", world=2)))  # the page
    rank1 = Source(run_id="d", rank=1, world_size=2)
    feed(IngestBatch(checkpoints=[_parity("d", 1, 20, "odd2", world=2)], run_ends=[(rank1, RunEnd(time=30.0))]))
    feed(_batch(_parity("d", 0, 20, "y2", world=2)))  # rank 0 is slower: step 20 is judged after rank 1 ended
    assert [(a.rank, a.step) for a in pages] == [(1, 15)], pages


def test_a_rank_whose_whole_run_arrives_first_is_still_compared_with_the_other() -> None:
    """An agent that reached the broker late delivers its whole run at once: rank 0's digests and its
    run_end came in one batch, rank 1's in the next. Rank 0's later steps alone are no reason to judge
    its earlier ones without rank 1, and its end does not end a run whose rank 1 was not seen yet."""
    from trainvigil.daemon import detectors
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.daemon.detectors import run_all
    from trainvigil.schemas import RunEnd

    dets = detectors.build(DaemonConfig().detectors)
    roots = {0: ["a", "b", "c", "d", "e", "f"], 1: ["a", "b", "c", "X", "Y", "Z"]}  # rank 1 differs from step 15

    def whole_run(rank: int) -> IngestBatch:
        digests = [_parity("late", rank, 5 * k, roots[rank][k], world=2) for k in range(6)]
        end = (Source(run_id="late", rank=rank, world_size=2), RunEnd(time=40.0 + rank))
        return IngestBatch(checkpoints=digests, run_ends=[end], now=100.0 + rank)

    first = run_all(dets, whole_run(0))
    assert [a for a in first if a.detector == "ckpt_mismatch"] == [], "rank 1 not in yet"
    assert dets.runs.ranks("late") == [], "rank 0 ended; the run waits for rank 1"
    pages = [a for a in run_all(dets, whole_run(1)) if a.detector == "ckpt_mismatch" and a.state == "open"]
    assert [(a.rank, a.step, a.severity) for a in pages] == [(1, 15, "page")]
    assert dets.tracked()["ckpt_mismatch"] == 0, "both ranks ended: the run's parity state is gone"


def test_a_run_waiting_for_ranks_never_seen_is_forgotten_after_the_idle_horizon() -> None:
    from trainvigil.daemon import detectors
    from trainvigil.daemon.config import DaemonConfig
    from trainvigil.daemon.detectors import Detectors, run_all
    from trainvigil.schemas import RunEnd

    dets = Detectors(detectors.build(DaemonConfig().detectors), idle_forget_s=60.0)
    end = (Source(run_id="alone", rank=0, world_size=4), RunEnd(time=1.0))
    run_all(dets, IngestBatch(checkpoints=[_parity("alone", 0, 5, "x", world=4)], run_ends=[end], now=1.0))
    assert dets.tracked()["ckpt_mismatch"] > 0, "ranks 1-3 may still deliver"
    run_all(dets, IngestBatch(now=200.0))
    assert dets.tracked()["ckpt_mismatch"] == 0
