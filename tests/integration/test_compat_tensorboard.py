"""``trainvigil.tensorboard.SummaryWriter``: a script written for TensorBoard logs into a real daemon with one
changed import; the non-scalar calls are dropped (counted), unknown ones refused in one line."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from inprocess import InProcessDaemon
from support import NatsServer, wait_for

from trainvigil.tensorboard import SummaryWriter

SCRIPT = """
import numpy as np

from trainvigil.tensorboard import SummaryWriter

writer = SummaryWriter(log_dir="runs/demo", comment="-lr3e-4")
for global_step in range(30):
    loss = float("nan") if global_step == 15 else 1.0 / (global_step + 1)
    writer.add_scalar("Loss/train", loss, global_step)
    writer.add_scalar("charts/learning_rate", 3e-4, global_step)
    writer.add_scalars("acc", {"train": 0.5, "val": 0.4}, global_step)
    writer.add_histogram("weights", np.zeros(8), global_step)
    if global_step % 10 == 0:
        writer.add_text("note", f"step {global_step}", global_step)
writer.add_hparams({"lr": 3e-4, "optimizer": "adam"}, {"hparam/loss": 0.1})
writer.close()
"""


def _fields(daemon: InProcessDaemon, run_id: str, kind: str) -> list[dict[str, object]]:
    rows = daemon.sql(f"select fields from events where run_id = '{run_id}' and kind = '{kind}' order by time").rows
    return [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in rows]


def test_a_tensorboard_script_logs_scalars_under_both_names_and_a_nan_loss_pages(
    daemon: InProcessDaemon, nats_server: NatsServer, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "VIGIL_NATS_URL": nats_server.url, "VIGIL_RUN_ID": "tb-demo", "VIGIL_FLUSH_INTERVAL": "0.05"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("dropped 'add_histogram'") == 1, done.stderr
    assert not (tmp_path / "runs").exists(), "no event files without tee=True"
    wait_for(lambda: daemon.scalar("select count(*) from runs where run_id = 'tb-demo' and status = 'ok'") == 1,
             30, "the run ended ok")  # fmt: skip

    rows = daemon.sql(
        "select step, loss, extra['Loss/train'], lr, extra['charts/learning_rate'], extra['acc/train'], "
        "extra['acc/val'] from steps where run_id = 'tb-demo' order by step"
    ).rows
    assert [r[0] for r in rows] == list(range(30)), "one row per global_step: the calls of a step merged"
    for step, loss, original, lr, lr_original, acc_train, acc_val in rows:
        if step == 15:
            assert loss != loss and original != original
        else:
            assert loss == original == pytest.approx(1.0 / (step + 1))
        assert lr == lr_original == 3e-4 and (acc_train, acc_val) == (0.5, 0.4)

    pages = daemon.sql("select step, severity from anomalies where run_id = 'tb-demo' and detector = 'non_finite'")
    assert [tuple(r) for r in pages.rows] == [(15, "page")]
    assert [f["text"] for f in _fields(daemon, "tb-demo", "text")] == ["step 0", "step 10", "step 20"]
    assert _fields(daemon, "tb-demo", "hparams") == [
        {"hparams": {"lr": 3e-4, "optimizer": "adam"}, "metrics": {"hparam/loss": 0.1}}
    ]
    assert _fields(daemon, "tb-demo", "compat_dropped") == [{"shim": "tensorboard", "dropped": {"add_histogram": 30}}]


@pytest.fixture
def writer() -> Iterator[SummaryWriter]:
    """A writer over a disabled agent (no broker): the shim's own logic."""
    with SummaryWriter(run_id="tb-units", vigil={"enabled": False}) as w:
        yield w


def test_non_scalar_calls_are_accepted_counted_and_warned_once(
    writer: SummaryWriter, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="trainvigil.tensorboard"):
        for step in range(3):
            writer.add_histogram("w", np.zeros(4), step)
            writer.add_image("img", np.zeros((3, 4, 4)), step)
            writer.add_graph(object())
            writer.add_scalar("caption", "not a number", step)
    assert writer.dropped == {"add_histogram": 3, "add_image": 3, "add_graph": 3, "caption": 3}
    assert len(caplog.records) == 4


def test_unknown_calls_raise_one_line_naming_the_call(writer: SummaryWriter) -> None:
    with pytest.raises(AttributeError, match=r"^trainvigil\.tensorboard\.SummaryWriter has no 'add_foo': ") as err:
        writer.add_foo("x", 1.0)
    assert "\n" not in str(err.value)


def test_a_scalar_without_global_step_lands_on_the_last_step(writer: SummaryWriter) -> None:
    writer.add_scalar("loss", 1.0, 7)
    writer.add_scalar("loss", 1.0)
    assert writer.step == 7
    writer.add_scalars("acc", {"train": 0.5})
    assert writer.step == 7
    writer.add_scalar("loss", 1.0, np.int64(9))
    assert writer.step == 9


def test_tee_passes_everything_on_to_a_real_summary_writer(tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.tensorboard")
    with SummaryWriter(str(tmp_path / "tb"), run_id="tb-tee", tee=True, vigil={"enabled": False}) as w:
        w.add_scalar("Loss/train", 1.0, 0)
        w.add_histogram("w", np.zeros(4), 0)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*")), "the real writer wrote its event file"
