"""``vigil bench-optim``: runs through a real daemon, results materialised in optim_results, stability by the detectors.

Plus the pure parts: Welch's test and t intervals against SciPy's values, the ranking, what an
unreadable result event does, and an optimizer that cannot be built (exit 2 before any run).
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import InProcessDaemon

from trainvigil.daemon.cli.main import main as vigil_main
from trainvigil.daemon.store._optim import COLUMNS, optim_rows
from trainvigil.schemas import RunEvent, Source
from trainvigil.schemas.optim import OPTIM_RESULT_EVENT, OptimResult

# trainvigil.optim (and the daemon's optim report, which uses its statistics) imports torch: the tests import
# them, so that collecting this module stays light.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")


@pytest.mark.timeout(200)  # trains every optimizer twice through a daemon: ~33 s alone, ~90 s loaded
def test_quick_bench_stores_every_optimizer_and_the_detectors_mark_lion_at_1000x_unstable(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    """Each optimizer's runs are real runs of the daemon; Lion at 1000x its LR draws a loss_spike page."""
    from trainvigil.optim.bench.specs import BUILTINS

    done = subprocess.run(
        [sys.executable, "-m", "trainvigil.daemon.cli", "bench-optim", "--quick", "--workload", "quadratic",
         "--seeds", "1", "--steps", "600", "--unstable-factor", "1000", "--nats", daemon.nats_url,
         "--png", str(tmp_path / "curves.png"), "--format", "json"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(r["optimizer"] for r in printed) == sorted(BUILTINS)

    rows = daemon.sql(
        "SELECT optimizer, run_id, unstable_run_id, stable, unstable_reason, final_loss, steps, state_bytes, "
        "step_time_mean_s FROM optim_results"
    ).rows
    stored = {r[0]: r for r in rows}
    assert sorted(stored) == sorted(BUILTINS)
    for optimizer, run_id, twin, _, _, final, steps, state, step_s in rows:
        assert run_id == f"optim-{optimizer}-quadratic-s0" and twin == f"{run_id}-x1000"
        assert steps == 600 and math.isfinite(final) and state > 0 and step_s > 0
        assert daemon.scalar(f"SELECT count(*) FROM steps WHERE run_id = '{run_id}'") == 600
    _, _, twin, stable, reason, *_ = stored["lion"]
    assert stable is False and reason.split()[0] in ("loss_spike", "non_finite"), reason
    pages = daemon.sql(f"SELECT detector FROM anomalies WHERE run_id = '{twin}' AND severity = 'page'").rows
    assert [reason.split()[0]] in pages
    assert "stored in optim_results" in done.stderr


def test_optim_results_columns_are_commented(daemon: InProcessDaemon) -> None:
    comments = daemon.sql(
        "SELECT column_name, comment FROM duckdb_columns() WHERE table_name = 'optim_results' ORDER BY column_index"
    ).rows
    assert [c for c, _ in comments] == list(COLUMNS)
    assert all(comment for _, comment in comments)


def test_an_optimizer_that_is_not_one_exits_2_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert vigil_main(["bench-optim", "--optim", "json:dumps", "--nats", "nats://127.0.0.1:1"]) == 2
    assert "is not a torch.optim.Optimizer subclass" in capsys.readouterr().err


def test_specs_from_flags() -> None:
    from trainvigil.optim.bench.specs import BUILTINS, SpecError, from_flag, parse_kwargs

    spec = from_flag("torch.optim:SGD", parse_kwargs(["momentum=0.9", "nesterov=true"]), 0.1)
    assert (spec.name, spec.kwargs, spec.lr) == ("sgd", {"momentum": 0.9, "nesterov": True}, 0.1)
    assert from_flag("lion", {}, None).lr_factor == BUILTINS["lion"].lr_factor
    with pytest.raises(SpecError, match="module:Class"):
        from_flag("AdamW", {}, None)


def test_an_unreadable_result_event_makes_no_row() -> None:
    source = Source(run_id="optim-bench-x")
    good = RunEvent(time=1.0, kind=OPTIM_RESULT_EVENT, fields={"run_id": "optim-lion-rl-s0", "seed": 1})
    bad = RunEvent(time=1.0, kind=OPTIM_RESULT_EVENT, fields={"seed": "one"})
    other = RunEvent(time=1.0, kind="eval", fields={"run_id": "x"})
    rows = optim_rows([(source, good), (source, bad), (source, other)])
    assert len(rows) == 1 and len(rows[0]) == len(COLUMNS)
    assert rows[0][1:3] == ("optim-bench-x", "optim-lion-rl-s0")


def test_welch_and_intervals_match_scipy() -> None:
    from trainvigil.optim.bench import stats

    a, b = [1.0, 1.2, 0.9, 1.1], [1.5, 1.4, 1.7]
    t, p = stats.welch(a, b)
    assert t == pytest.approx(-4.422458539645533) and p == pytest.approx(0.011756015260926784, rel=1e-9)
    assert stats.t_quantile(0.975, 2) == pytest.approx(4.302652729749462, rel=1e-9)
    assert stats.mean_ci([1.0, 2.0, 3.0]) == pytest.approx((2.0, 2.4841377117503285))
    assert stats.steps_to_half([4.0, 3.0, 2.0, 1.0]) == 2 and stats.steps_to_half([1.0, 0.9]) is None
    assert stats.final_loss(list(range(100))) == pytest.approx(97.0)


def test_summary_ranks_by_final_loss_within_each_workload() -> None:
    from trainvigil.daemon.cli._optim_report import summary

    def r(opt: str, seed: int, loss: float) -> OptimResult:
        return OptimResult(run_id=f"optim-{opt}-q-s{seed}", optimizer=opt, workload="q", seed=seed, final_loss=loss,
                           stable=opt != "lion")  # fmt: skip

    table = summary([r("adamw", 0, 2.0), r("adamw", 1, 2.2), r("lion", 0, 1.0), r("lion", 1, 1.1)], "adamw")
    (first, second) = table.rows
    assert first[2] == "lion" and first[1] == 1 and first[5] is not None and first[-1] == "0/2 at 10x"
    assert second[2] == "adamw" and second[5] is None


def test_a_version_3_file_gains_optim_results_and_materialises_result_events(tmp_path: Path) -> None:
    """Migration to schema 4: the table appears; a result event written after it makes a row."""
    import duckdb

    from trainvigil.daemon.batch.decode import IngestBatch
    from trainvigil.daemon.store.schema import SCHEMA_VERSION
    from trainvigil.daemon.store.writer import Store

    path = tmp_path / "vigil.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE schema_info (version INTEGER); INSERT INTO schema_info VALUES (3)")
    store = Store(path)
    try:
        assert SCHEMA_VERSION == 4
        assert store.con.execute("SELECT version FROM schema_info").fetchall() == [(4,)]
        event = RunEvent(time=1.0, kind=OPTIM_RESULT_EVENT, fields={"run_id": "optim-adan-rl-s2", "stable": False})
        store.write(IngestBatch(events=[(Source(run_id="optim-bench-y"), event)]))
        rows = store.con.execute("SELECT bench_id, run_id, stable FROM optim_results").fetchall()
        assert rows == [("optim-bench-y", "optim-adan-rl-s2", False)]
        assert store.con.execute("SELECT count(*) FROM events WHERE kind = 'optim_result'").fetchall() == [(1,)]
    finally:
        store.close()
