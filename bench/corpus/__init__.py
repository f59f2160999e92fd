"""The corpus of real training runs the detectors are judged on (``tests/data/corpus/``).

- ``runs``: which runs exist, their faults, seeds, expected detectors and latency budgets.
- ``ppo``, ``supervised``, ``gpt``, ``regression``: the real training workloads (run as
  ``python -m bench.corpus.<name>``).
- ``record``: trains each run beside a real broker and daemon (``_stack``) and exports what
  was stored (``_export``, ``manifest``).
- ``load``: reads a recorded run back; ``score``: scores alerts against its manifest.

Nothing is imported here: the workloads need torch, gymnasium and scikit-learn (the
``corpus`` extra), which reading the corpus does not.
"""

__all__: list[str] = []
