"""Metric-name typos are said, not silent: the agent warns once per name that resembles a known
metric (its values still go to ``extra``), and ``vigil plot`` of a metric the run lacks is a
usage error that lists the run's metrics and suggests the closest."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from inprocess import InProcessDaemon
from support import NatsServer, vigil, wait_for

import trainvigil
from trainvigil.agents._values import resembles_known

STEPS = 300


def _typo_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "trainvigil.agent" and r.levelno == logging.WARNING and "resembles" in r.getMessage()
    ]


def _log_run(daemon: InProcessDaemon, nats_url: str, run_id: str, spill: Path) -> None:
    agent = trainvigil.init(run_id=run_id, nats_url=nats_url, spill_dir=spill, flush_interval=0.05)
    for step in range(STEPS):
        agent.log(step, los=1.0 / (step + 1), grad_nrom=0.5, lr=1e-3, grad_norm=0.4, val_loss=2.0)
        if step % 100 == 99:
            assert agent.flush(30)  # several batches: each name is still said once
    agent.close(timeout=30)
    wait_for(
        lambda: daemon.scalar(f"select count(*) from steps where run_id = '{run_id}'") >= STEPS, 60, "the run's rows"
    )


def test_an_agent_warns_once_per_metric_name_that_resembles_a_known_one(
    daemon: InProcessDaemon, nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainvigil.agent")
    _log_run(daemon, nats_server.url, "typos", tmp_path / "spill")
    said = _typo_warnings(caplog)
    assert len(said) == 2, said
    assert sum("'los'" in line and "'loss'" in line for line in said) == 1, said
    assert sum("'grad_nrom'" in line and "'grad_norm'" in line for line in said) == 1, said
    assert not any("val_loss" in line for line in said), "a name that holds a known one is deliberate"
    rows = daemon.sql(
        "select extra['los'], extra['grad_nrom'], loss from steps where run_id = 'typos' order by step limit 2"
    ).rows
    assert [tuple(r) for r in rows] == [(1.0, 0.5, None), (0.5, 0.5, None)], "the values are kept in extra"


@pytest.mark.parametrize(
    ("name", "known"),
    [
        ("los", "loss"),
        ("grad_nrom", "grad_norm"),
        ("grad_nrm", "grad_norm"),
        ("Loss", "loss"),
        ("LR", "lr"),
        ("steptime", "step_time"),
        ("val_loss", None),
        ("loss2", None),
        ("l2", None),
        ("k1", None),
        ("accuracy", None),
        ("loss", None),
    ],
)
def test_which_names_resemble_a_known_metric(name: str, known: str | None) -> None:
    assert resembles_known(name) == known


def test_plotting_a_metric_the_run_lacks_is_a_usage_error_that_suggests_the_closest(
    daemon: InProcessDaemon, nats_server: NatsServer, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")  # without it plot stops earlier, saying so
    _log_run(daemon, nats_server.url, "plotted", tmp_path / "spill")
    out = tmp_path / "plot.png"
    args = ["--nats", nats_server.url, "--data-dir", str(daemon.data_dir), "-o", str(out)]
    result = vigil("plot", "plotted", "--metrics", "grad_nrm", *args)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "grad_nrm" in result.stderr and "did you mean 'grad_norm'" in result.stderr, result.stderr
    for metric in ("grad_norm", "lr", "los", "grad_nrom", "val_loss"):
        assert metric in result.stderr.split("its metrics:")[-1], result.stderr
    assert not out.exists()
    good = vigil("plot", "plotted", "--metrics", "grad_norm,los", *args)
    assert good.returncode == 0, good.stderr[-2000:]
    assert "(2 panels)" in good.stderr
