"""``loss_spike`` near a loss's floor: relative blips of a converged loss are no incident; real spikes still are.

On plain data (a loss that falls from ~2.3 to ~1e-4, then blips to several times its level)
and on the corpus's real curve fit (``reg-curve-clean``: an MSE from ~1 to ~1e-6 whose Adam
steps near the minimum blip it 5-60x for five steps and more), replayed as live ingest feeds
the detectors; and the real faults loss_spike catches (a poisoned batch where the loss is
~1e-5, an LR x30 on a GPT) caught as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_detectors import noisy, opened, run_detector

from trainvigil.daemon.cli.replay import replay_table

CORPUS = Path(__file__).parents[1] / "data" / "corpus"
N = 4000


def converged(seed: int) -> np.ndarray:
    """A loss that falls from ln(10) to ~1e-4 over the first half, then stays there with 5% noise."""
    level = np.maximum(2.3 * np.exp(-np.arange(N) / 200.0), 1e-4)
    return level * noisy(seed, n=N, sigma=0.05)


def test_relative_blips_of_a_converged_loss_raise_nothing() -> None:
    loss = converged(1)
    loss[2500] *= 6  # one batch 6x its level: a transient flag, were it judged relative only
    loss[3000:3008] *= 3  # eight steps at 3x: the persistent rule's page, were it judged relative only
    assert run_detector("loss_spike", {0: {"loss": loss}}) == []
    # The same series judged by relative size alone (no least rise) warns and pages: the blips are there.
    relative = run_detector("loss_spike", {0: {"loss": loss}}, settings={"min_rise": 0.0})
    assert [a.step for a in opened(relative)] == [2500, 3000]
    assert any(a.severity == "page" and a.step == 3000 for a in relative)


def test_a_real_spike_from_a_converged_loss_still_warns_and_a_lasting_one_pages() -> None:
    loss = converged(2)
    loss[2500] = 0.5  # far above the run's noise and a fifth of its early loss
    found = opened(run_detector("loss_spike", {0: {"loss": loss}}))
    assert [(a.step, a.severity) for a in found] == [(2500, "warn")]
    assert found[0].threshold is not None and found[0].value is not None and found[0].value >= found[0].threshold

    loss = converged(3)
    loss[3000:3020] = 0.3  # a lasting jump from 1e-4 to 0.3
    out = run_detector("loss_spike", {0: {"loss": loss}})
    assert [a.step for a in opened(out)] == [3000]
    assert any(a.severity == "page" and a.last_step == 3004 for a in out)


def test_the_least_rise_is_part_of_the_printed_threshold() -> None:
    """A flag's threshold is one its value crossed, the least rise included."""
    loss = converged(4)
    loss[2500] = 0.5
    (found,) = opened(run_detector("loss_spike", {0: {"loss": loss}}, settings={"min_rise": 0.2}))
    assert found.baseline is not None and found.threshold is not None
    assert found.threshold >= found.baseline + 0.2 * 2.3 * 0.9
    assert found.value is not None and found.value >= found.threshold


def test_a_converged_real_curve_fit_raises_no_loss_spike() -> None:
    table = pq.read_table(CORPUS / "reg-curve-clean" / "steps.parquet")
    flagged = [(a.step, a.severity, a.message[:100]) for a in replay_table(table) if a.detector == "loss_spike"]
    assert flagged == []


def _fault(name: str) -> int:
    return int(json.loads((CORPUS / name / "manifest.json").read_text())["fault"]["step"])


@pytest.mark.parametrize(("name", "budget"), [("sup-digits-poison", 0), ("gpt-lr-x30", 5)])
def test_the_real_loss_faults_are_still_caught_by_loss_spike(name: str, budget: int) -> None:
    fault = _fault(name)
    table = pq.read_table(CORPUS / name / "steps.parquet")
    caught = [
        a for a in replay_table(table) if a.detector == "loss_spike" and a.state == "open" and (a.step or 0) >= fault
    ]
    assert caught and caught[0].step is not None and caught[0].step - fault <= budget, caught[:1]
