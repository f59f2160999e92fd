"""The metric names public training scripts log under, mapped onto the names the detectors read (pure).

``trainvigil.wandb`` and ``trainvigil.tensorboard`` log each value under its own name (a custom metric, in
``extra``) and, when the name is one of :data:`DETECTOR_NAMES` (compared in lower case), also under the
detectors' name. A target starting with ``-`` is the negated value: SB3's ``train/entropy_loss`` is minus
the entropy. ``val_loss``, ``eval_reward`` and ``eval_return`` are custom metrics the ``generalisation``
and ``reward_hack`` detectors read by those names; the others are the ``steps`` table's own columns.
Both sides read it: the shims to add the detectors' name, the web view to show which detector input each
logged name feeds (so the wire contract holds it, as it holds the metric names themselves).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DETECTOR_NAMES", "detector_name"]

DETECTOR_NAMES: Mapping[str, str] = {
    # the training loss (loss_spike, non_finite, generalisation's training side)
    "train/loss": "loss", "losses/loss": "loss", "train_loss": "loss", "loss/train": "loss",
    # a held-out loss (generalisation reads val_loss)
    "val/loss": "val_loss", "eval/loss": "val_loss", "validation/loss": "val_loss", "valid/loss": "val_loss",
    "loss/val": "val_loss", "loss/validation": "val_loss", "loss/test": "val_loss", "test/loss": "val_loss",
    # the learning rate
    "learning_rate": "lr", "train/learning_rate": "lr", "charts/learning_rate": "lr", "train/lr": "lr",
    # the gradient norm before clipping (grad_spike, non_finite)
    "train/grad_norm": "grad_norm", "gradient_norm": "grad_norm", "grad/norm": "grad_norm",
    # RL: the training reward, entropy and KL (reward_hack, kl_explode, non_finite)
    "charts/episodic_return": "reward", "rollout/ep_rew_mean": "reward",
    "losses/entropy": "entropy", "train/entropy_loss": "-entropy",
    "losses/approx_kl": "kl", "train/approx_kl": "kl",
    # RL: a held-out return (reward_hack's eval series)
    "eval/mean_reward": "eval_reward", "charts/eval_return": "eval_return", "eval/episodic_return": "eval_return",
}  # fmt: skip
"""Common names (lower case) -> the detectors' name; ``-name``: the value negated."""


def detector_name(name: str, extra: Mapping[str, str] | None = None) -> tuple[str | None, bool]:
    """The detectors' name for ``name`` (``None`` when it has none, or is that name already) and whether
    the value is negated. ``extra`` (a user's ``names={...}``) is looked up first, as written, then in lower
    case; then :data:`DETECTOR_NAMES`."""
    target = None
    if extra:
        target = extra.get(name) or extra.get(name.lower())
    if target is None:
        target = DETECTOR_NAMES.get(name.lower())
    if target is None:
        return None, False
    negate = target.startswith("-")
    target = target[1:] if negate else target
    return (None, False) if target == name else (target, negate)
