"""``vigil replay``: recordings through the live detectors offline, and the command's exit codes."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import vigil

from trainvigil.daemon.cli.replay import batches, read_recording, replay_table
from trainvigil.daemon.config import load
from trainvigil.errors import ReplayError

NAN_STEP = 200
STEPS = 300


def _trace(seed: int = 0, steps: int = STEPS, ranks: int = 2, nan_rank: int = 1) -> list[dict[str, object]]:
    """A healthy-looking run (decaying loss, noisy grad norm) with one NaN loss, rows shuffled."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    for rank in range(ranks):
        for step in range(steps):
            loss = 2.0 * np.exp(-step / 400) + 0.02 * abs(rng.standard_normal())
            rows.append(
                {
                    "run_id": "run-a",
                    "rank": rank,
                    "step": step,
                    "loss": float("nan") if (rank, step) == (nan_rank, NAN_STEP) else float(loss),
                    "grad_norm": float(1.0 + 0.05 * rng.standard_normal()),
                }
            )
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def _non_finite(found: list) -> list[tuple[str, int, int | None, str, str]]:  # type: ignore[type-arg]
    return [(a.run_id, a.rank, a.step, a.severity, a.state) for a in found if a.detector == "non_finite"]


def test_a_nan_at_step_n_opens_one_non_finite_episode_at_n_that_clears_after_the_cooldown() -> None:
    found = replay_table(pa.Table.from_pylist(_trace()))
    assert _non_finite(found) == [("run-a", 1, NAN_STEP, "page", "open"), ("run-a", 1, NAN_STEP, "page", "cleared")]
    opened = next(a for a in found if a.detector == "non_finite")
    assert opened.time == NAN_STEP, "without a time column a step lasts one second"


def test_row_order_does_not_change_what_fires() -> None:
    rows = _trace()
    ordered = sorted(rows, key=lambda r: (r["rank"], r["step"]))  # type: ignore[arg-type, return-value]
    shuffled, sorted_ = (replay_table(pa.Table.from_pylist(r)) for r in (rows, ordered))
    assert shuffled and repr(shuffled) == repr(sorted_), "the same updates (repr: NaN equals NaN there)"


def test_batches_hold_every_rank_side_by_side_and_end_each_run() -> None:
    rows = _trace(steps=600, ranks=3) + [{**r, "run_id": "run-b"} for r in _trace(steps=10, ranks=1)]
    table = pa.Table.from_pylist(rows).append_column("time", pa.array([1000.0 + r["step"] for r in rows]))  # type: ignore[operator]
    got = list(batches(table, batch_steps=256))
    spans = [[(p.source.run_id, p.source.rank, int(p.step[0]), int(p.step[-1])) for p in b.steps] for b in got]
    assert spans == [
        [("run-a", r, 0, 255) for r in range(3)],
        [("run-a", r, 256, 511) for r in range(3)],
        [("run-a", r, 512, 599) for r in range(3)],
        [],
        [("run-b", 0, 0, 9)],
        [],
    ]
    assert [b.now for b in got] == [1255.0, 1511.0, 1599.0, 1599.0, 1009.0, 1009.0]
    assert [[(s.run_id, s.rank, e.last_step) for s, e in b.run_ends] for b in got if b.run_ends] == [
        [("run-a", 0, 599), ("run-a", 1, 599), ("run-a", 2, 599)],
        [("run-b", 0, 9)],
    ]


def test_a_silence_in_the_recording_ticks_through_so_stall_pages_and_a_clean_end_does_not() -> None:
    step = np.arange(600)
    time = 1e9 + step.astype(float)
    time[300:] += 600.0  # ten minutes without a step after step 299, then training resumes
    table = pa.table({"run_id": ["s"] * 600, "rank": [0] * 600, "step": step, "time": time, "loss": np.ones(600)})
    got = list(batches(table, batch_steps=256))
    spans = [(int(b.steps[0].step[0]), int(b.steps[0].step[-1])) for b in got if b.steps]
    assert spans == [(0, 255), (256, 299), (300, 555), (556, 599)], "no batch spans the silence"
    ticks = [b.now for b in got if not b.steps and not b.run_ends]
    assert len(ticks) >= 50 and all(t is not None and 1e9 + 299 < t < 1e9 + 900 for t in ticks), (
        "empty batches tick through it"
    )
    stalls = [(a.step, a.state) for a in replay_table(table) if a.detector == "stall"]
    assert stalls[0] == (299, "open"), stalls
    assert all(a.detector != "stall" for a in replay_table(table.slice(0, 300))), "the end of a file is no stall"


def test_in_csv_an_empty_cell_is_absent_but_nan_is_a_value(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    lines = ["run_id,rank,step,time,loss"] + [f"r,0,{s},{5000 + 2 * s},{1.0 + s / 1000}" for s in range(100)]
    lines[31] = "r,0,30,5060,"  # absent
    lines[71] = "r,0,70,5140,nan"
    path.write_text("\n".join(lines) + "\n")
    table = read_recording(path)
    found = replay_table(table)
    assert _non_finite(found) == [("r", 0, 70, "page", "open")]
    assert found[0].time == 5140.0, "the time column is used"
    assert table["loss"].null_count == 1


def test_bad_recordings_are_refused_with_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match=r"missing column.*rank"):
        replay_table(pa.table({"run_id": ["r"], "step": [1], "loss": [1.0]}))
    with pytest.raises(ReplayError, match=r"'phase'.*must hold numbers"):
        replay_table(pa.table({"run_id": ["r"], "rank": [0], "step": [1], "phase": ["warmup"]}))
    with pytest.raises(ReplayError, match="'step' has 1 empty cells"):
        replay_table(pa.table({"run_id": ["r", "r"], "rank": [0, 0], "step": [1, None], "loss": [1.0, 1.0]}))
    with pytest.raises(ReplayError, match="no metric columns"):
        replay_table(pa.table({"run_id": ["r"], "rank": [0], "step": [1]}))
    with pytest.raises(ReplayError, match="does not exist"):
        read_recording(tmp_path / "missing.csv")
    with pytest.raises(ReplayError, match="--format"):
        read_recording(tmp_path / "recording.txt")
    (tmp_path / "bad.jsonl").write_text('{"run_id": "r", "rank": 0, "step": 1}\nnot json\n')
    with pytest.raises(ReplayError, match="line 2 is not JSON"):
        read_recording(tmp_path / "bad.jsonl")


def _write(rows: list[dict[str, object]], path: Path) -> None:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".jsonl":
        # Python's json writes NaN as a bare NaN literal; an absent value is a missing key or null.
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        names = list(rows[0])
        cells = [",".join("" if r.get(n) is None else str(r[n]) for n in names) for r in rows]
        path.write_text(",".join(names) + "\n" + "\n".join(cells) + "\n")


_vigil = functools.partial(vigil, timeout=60)


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
def test_vigil_replay_prints_one_json_line_per_update(tmp_path: Path, suffix: str) -> None:
    rows = _trace(steps=240)  # the NaN episode stays open: fewer than 50 steps follow it
    rows[0] = {**rows[0], "grad_norm": None}  # an absent value, in each format's own way
    path = tmp_path / f"recording{suffix}"
    _write(rows, path)
    result = _vigil("replay", str(path))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    non_finite = [line for line in lines if line["detector"] == "non_finite"]
    assert non_finite == [
        {
            "run_id": "run-a",
            "rank": 1,
            "step": NAN_STEP,
            "detector": "non_finite",
            "severity": "page",
            "state": "open",
            "value": "NaN",
            "baseline": None,
            "threshold": None,
            "message": non_finite[0]["message"],
        }
    ]
    assert f"loss is nan at step {NAN_STEP}" in non_finite[0]["message"]


def test_vigil_replay_uses_the_detector_settings_of_config(tmp_path: Path) -> None:
    path = tmp_path / "recording.csv"
    _write(_trace(), path)
    config = tmp_path / "vigil.toml"
    config.write_text('[detectors.non_finite]\nmetrics = ["grad_norm"]\n')
    assert load(config).detectors.non_finite.metrics == ("grad_norm",)  # type: ignore[attr-defined]
    result = _vigil("replay", str(path), "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert not [line for line in result.stdout.splitlines() if '"non_finite"' in line], "loss is not watched"


def test_vigil_replay_exits_2_on_a_missing_or_bad_file(tmp_path: Path) -> None:
    missing = _vigil("replay", str(tmp_path / "nope.parquet"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and not missing.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("run,step,loss\nr,1,1.0\n")
    refused = _vigil("replay", str(bad))
    assert refused.returncode == 2 and "missing column(s) run_id, rank" in refused.stderr
    not_parquet = _vigil("replay", str(bad), "--format", "parquet")
    assert not_parquet.returncode == 2 and "not a readable parquet file" in not_parquet.stderr


def test_vigil_replay_of_a_directory_carries_its_events_and_heartbeats() -> None:
    """A directory of steps/events/heartbeats Parquet (a corpus run, or ``vigil export`` of each
    table): its heartbeats show the hung loop was alive, so ``hang`` pages; without them it cannot."""
    run = Path(__file__).parents[1] / "data" / "corpus" / "gpt-hang"
    out = subprocess.run(
        [sys.executable, "-m", "trainvigil.daemon.cli", "replay", str(run)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    found = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert any(f["detector"] == "hang" and f["state"] == "open" and f["severity"] == "page" for f in found)
    steps_only = replay_table(read_recording(run / "steps.parquet"))
    assert all(a.detector != "hang" for a in steps_only)
