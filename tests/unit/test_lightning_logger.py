"""LightningLogger's mapping of hyper-parameters onto the ``hparams`` event (the full run is in test_integrations)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

import trainvigil

# lightning is imported by the test (it takes seconds): collecting this module stays light.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning not installed")


def test_a_hyperparameter_named_step_is_kept_and_does_not_become_the_events_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainvigil.integrations import LightningLogger

    calls: list[tuple[str, int | None, dict[str, Any]]] = []
    agent = trainvigil.init(run_id="pl-hparams", nats_url="nats://127.0.0.1:1", spill_dir=tmp_path)
    try:
        monkeypatch.setattr(agent, "event", lambda kind, step=None, **fields: calls.append((kind, step, fields)))
        LightningLogger().log_hyperparams({"step": 7, "lr": 0.01, "layers": (4, 4)})
    finally:
        monkeypatch.undo()
        agent.close(timeout=0.2)
    assert calls == [("hparams", None, {"hparam_step": 7, "lr": 0.01, "layers": "(4, 4)"})]
