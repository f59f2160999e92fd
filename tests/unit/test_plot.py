"""``vigil plot`` (``daemon/cli/plot.py``) without its extra installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainvigil.daemon.cli.main import main


def test_vigil_plot_without_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["plot", "r", "--data-dir", str(tmp_path), "--nats", "nats://127.0.0.1:1"]) == 3
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "vigil: plot needs matplotlib; install it with: pip install 'trainvigil[plot]'"
    )
