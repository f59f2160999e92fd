"""Framework integrations: each lives in a module of its own and imports its framework, so import the one you
use (or take it from :mod:`trainvigil.integrations`, which loads it on first use).

- :mod:`.hf`: ``TrainerCallback`` for Hugging Face ``transformers.Trainer``;
- :mod:`.lightning`: ``LightningLogger`` (and ``GradNormCallback``) for PyTorch Lightning;
- :mod:`.sb3`: ``SB3Callback`` for Stable-Baselines3.

Every integration starts an agent when none runs in the process (and closes it at the end of training
with the run's status), or logs through the one the script started with ``trainvigil.init()``.
"""
