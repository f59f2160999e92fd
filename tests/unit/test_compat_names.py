"""The common metric names the shims map onto the names the detectors read (pure)."""

from __future__ import annotations

import pytest

from trainvigil._compat import Rows
from trainvigil.agents._names import DETECTOR_NAMES, detector_name
from trainvigil.daemon.detectors.generalisation import GeneralisationSettings
from trainvigil.daemon.detectors.reward_hack import EVAL_METRICS
from trainvigil.schemas import KNOWN_METRICS


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("train/loss", "loss"), ("loss", None), ("losses/loss", "loss"), ("train_loss", "loss"), ("Loss/train", "loss"),
        ("val/loss", "val_loss"), ("eval/loss", "val_loss"), ("val_loss", None), ("validation/loss", "val_loss"),
        ("lr", None), ("learning_rate", "lr"), ("train/learning_rate", "lr"), ("charts/learning_rate", "lr"),
        ("grad_norm", None), ("train/grad_norm", "grad_norm"), ("gradient_norm", "grad_norm"),
        ("charts/episodic_return", "reward"), ("rollout/ep_rew_mean", "reward"),
        ("losses/entropy", "entropy"), ("losses/approx_kl", "kl"), ("train/approx_kl", "kl"),
        ("accuracy", None),
    ],
)  # fmt: skip
def test_common_names_map_onto_the_detectors_names(name: str, target: str | None) -> None:
    assert detector_name(name) == (target, False)


def test_sb3_entropy_loss_is_minus_the_entropy() -> None:
    assert detector_name("train/entropy_loss") == ("entropy", True)
    assert Rows("t").row({"train/entropy_loss": -0.7}) == {"train/entropy_loss": -0.7, "entropy": 0.7}


def test_every_target_is_a_name_a_detector_reads() -> None:
    read = {*KNOWN_METRICS, *GeneralisationSettings().metrics, *EVAL_METRICS}
    assert {t.lstrip("-") for t in DETECTOR_NAMES.values()} <= read
    assert all(name == name.lower() for name in DETECTOR_NAMES), "looked up in lower case"


def test_a_users_names_come_first() -> None:
    rows = Rows("t", {"my/objective": "loss", "train/loss": "train_loss_copy", "score": "-reward"})
    assert rows.row({"my/objective": 1.0}) == {"my/objective": 1.0, "loss": 1.0}
    assert rows.row({"train/loss": 2.0}) == {"train/loss": 2.0, "train_loss_copy": 2.0}
    assert rows.row({"score": 3.0, "Score": 4.0}) == {"score": 3.0, "reward": -3.0, "Score": 4.0}


def test_a_value_logged_under_the_detectors_name_wins_over_an_alias() -> None:
    rows = Rows("t")
    assert rows.row({"loss": 1.0, "train/loss": 2.0}) == {"loss": 1.0, "train/loss": 2.0}
    assert rows.row({"train/loss": 2.0, "loss": 1.0}) == {"loss": 1.0, "train/loss": 2.0}
