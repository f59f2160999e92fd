"""``generalisation``: validation loss up while training loss goes down.

Judged on recorded real runs (the corpus: a small GPT trained on real text, clean and with the
same batch repeated from a step on), plus the rules' edges on small hand-made series.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from trainvigil.daemon import detectors
from trainvigil.daemon.batch.decode import IngestBatch
from trainvigil.daemon.batch.from_arrays import Metric, batch_of, step_columns_of
from trainvigil.daemon.cli.replay import replay_table
from trainvigil.daemon.config import load
from trainvigil.schemas import Anomaly, RunEvent, RunStart, Source

CORPUS = Path(__file__).parents[1] / "data" / "corpus"


def _found(name: str) -> list[Anomaly]:
    return [a for a in replay_table(pq.read_table(CORPUS / name / "steps.parquet")) if a.detector == "generalisation"]


def test_clean_real_runs_never_alert() -> None:
    clean = [p.name for p in CORPUS.iterdir() if p.name.endswith("clean") or "-clean-" in p.name]
    assert any(name.startswith("gpt") for name in clean)
    for name in clean:
        assert _found(name) == [], name


def test_a_repeated_batch_pages_at_the_first_evaluation_after_it_and_names_memorisation() -> None:
    fault = json.loads((CORPUS / "gpt-repeat-batch" / "manifest.json").read_text())["fault"]["step"]
    found = _found("gpt-repeat-batch")
    assert found, "the memorisation was not seen"
    first = found[0]
    assert first.severity == "page" and first.step is not None
    assert 0 < first.step - fault <= 300, (fault, first.step)
    assert "memorising" in first.message and "best checkpoint" in first.message
    assert len({a.episode for a in found}) == 1, "one episode while it lasts, not one per evaluation"


def _run(
    val: list[float], train: list[float], *, every: int = 100, name: str = "val_loss", **extra: IngestBatch
) -> list[Anomaly]:
    """One evaluation per ``every`` steps; ``train[i]`` is the training loss of interval ``i``."""
    (det,) = [d for d in detectors.build(load(None, env={}).detectors) if d.name == "generalisation"]
    out: list[Anomaly] = []
    rng = np.random.default_rng(0)
    for i, (v, t) in enumerate(zip(val, train, strict=True)):
        steps = np.arange(i * every, (i + 1) * every)
        loss = t * np.exp(rng.normal(0, 0.05, every))
        vals = np.full(every, v)
        # ``name`` is present at the evaluation step only
        metrics: dict[str, Metric] = {"loss": loss, name: (vals, steps == steps[-1])}
        part = step_columns_of("run", 0, steps, metrics, time=steps.astype(float))
        out += det(batch_of(part, now=float(steps[-1])))
    return out


def test_gradual_overfitting_warns_then_pages_as_the_gap_grows() -> None:
    val = [2.0, 1.6, 1.4, 1.3, 1.32, 1.38, 1.45, 1.55, 1.7]
    train = [2.0, 1.6, 1.4, 1.25, 1.1, 0.95, 0.8, 0.7, 0.6]
    out = _run(val, train)
    assert [(a.state, a.severity) for a in out] == [("open", "warn"), ("escalated", "page")]
    assert out[0].step == 699 and "overfitting" in out[0].message


def test_validation_rising_with_the_training_loss_is_not_a_generalisation_failure() -> None:
    val = [2.0, 1.6, 1.4, 1.3, 2.2, 2.4, 2.6, 2.7]  # an LR blow-up: both curves go up
    train = [2.0, 1.6, 1.4, 1.25, 2.5, 2.6, 2.7, 2.8]
    assert _run(val, train) == []


def test_noise_in_a_plateau_does_not_alert() -> None:
    rng = np.random.default_rng(3)
    val = list(1.3 * (1 + rng.normal(0, 0.01, 60)))
    train = list(np.linspace(1.2, 1.0, 60))
    assert _run(val, train) == []


def test_a_declared_validation_metric_and_eval_events_are_read_too() -> None:
    val = [2.0, 1.6, 1.4, 1.3, 3.0]
    train = [2.0, 1.6, 1.4, 1.25, 1.2]
    assert [a.severity for a in _run(val, train, name="heldout_ppl")] == [], "not a validation name by default"
    (det,) = [d for d in detectors.build(load(None, env={}).detectors) if d.name == "generalisation"]
    src = Source(run_id="run", rank=0)
    det(IngestBatch(run_starts=[(src, RunStart(time=0.0, config={"val_metric": "heldout_ppl"}))]))
    out: list[Anomaly] = []
    for i, (v, t) in enumerate(zip(val, train, strict=True)):
        steps = np.arange(i * 100, (i + 1) * 100)
        part = step_columns_of("run", 0, steps, {"loss": np.full(100, t)}, time=steps.astype(float))
        batch = batch_of(part, now=float(steps[-1]))
        batch.events.append(
            (src, RunEvent(time=float(steps[-1]), kind="eval", step=int(steps[-1]), fields={"heldout_ppl": v}))
        )
        out += det(batch)
    assert [(a.state, a.severity, a.step) for a in out] == [("open", "page", 499)]


@pytest.mark.parametrize("min_evals", [3])
def test_nothing_is_judged_before_min_evals(min_evals: int) -> None:
    assert _run([2.0, 5.0, 9.0], [2.0, 1.0, 0.1]) == []


CURVES = re.compile(
    r"validation loss rose (?P<v0>[\d.]+) -> (?P<v1>[\d.]+) over steps (?P<s0>\d+) -> (?P<s1>\d+).*"
    r"while the training loss \(median per evaluation interval\) (?P<train>fell|stayed level|rose) "
    r"(?P<t0>[\d.]+) -> (?P<t1>[\d.]+) over the same steps"
)


def test_a_sudden_rise_while_the_training_loss_keeps_falling_is_named_memorisation_with_both_curves() -> None:
    val = [2.0, 1.6, 1.4, 1.3, 2.1]
    train = [2.0, 1.6, 1.4, 1.25, 1.0]
    (page,) = _run(val, train)
    assert page.severity == "page" and page.step == 499
    assert "memorising" in page.message and "overfitting" in page.message, page.message
    assert "stopped generalising" not in page.message
    curves = CURVES.search(page.message)
    assert curves is not None, page.message
    assert (float(curves["v0"]), float(curves["v1"]), int(curves["s0"]), int(curves["s1"])) == (1.3, 2.1, 399, 499)
    assert curves["train"] == "fell" and float(curves["t0"]) > float(curves["t1"])


def test_gradual_overfitting_names_both_curves_over_the_rises() -> None:
    val = [2.0, 1.6, 1.4, 1.3, 1.32, 1.38, 1.45, 1.55, 1.7]
    train = [2.0, 1.6, 1.4, 1.25, 1.1, 0.95, 0.8, 0.7, 0.6]
    out = _run(val, train)
    curves = CURVES.search(out[0].message)
    assert curves is not None, out[0].message
    assert (float(curves["v0"]), float(curves["v1"]), int(curves["s0"]), int(curves["s1"])) == (1.3, 1.45, 399, 699)
    assert curves["train"] == "fell"


def test_the_real_repeated_batch_page_names_both_curves() -> None:
    (first, *_) = _found("gpt-repeat-batch")
    curves = CURVES.search(first.message)
    assert curves is not None and curves["train"] == "fell", first.message
    assert "memorising" in first.message
