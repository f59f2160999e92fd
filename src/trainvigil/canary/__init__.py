"""Canary workloads: small real training jobs that prove, continuously, that the watching still works.

Each is an ordinary training script run as ``python -m trainvigil.canary.<name>``: it logs through
the agent (``trainvigil.init()``, ``vigil.log()``, ``trainvigil.torch.watch()``) exactly as a
user's script does, and ``VIGIL_FAULT=<kind>@<step>`` breaks its real training at a known step.
A canary runner starts one with ``VIGIL_RUN_ID``, ``VIGIL_NATS_URL`` and ``VIGIL_FAULT`` set and
checks that the right detector caught the fault (and nothing else paged), or, with no fault,
that nothing fired at all. CPU only, one intra-op thread, deterministic per ``--seed``.

:data:`WORKLOADS` says what each one is (name, module, default ``--steps``, the fault kinds it
applies, its default fault step). It is the wire contract's table (``trainvigil.schemas.canaries``),
which the daemon's canary runner reads without importing this package; the workloads take their
defaults from it. Importing this package does not import torch (the modules do).
"""

from __future__ import annotations

from trainvigil.schemas.canaries import WORKLOADS, Workload

__all__ = ["WORKLOADS", "Workload"]
