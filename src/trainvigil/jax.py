"""JAX / Flax integration: ``trainvigil.jax.grad_health`` inside a jitted step, and pytree checkpoints with
digests (``save``, ``load``, ``verify_file``). Importing it imports jax and flax. See
:mod:`trainvigil.agents.integrations.jax`."""

from __future__ import annotations

from trainvigil.agents.integrations.jax import grad_health, load, save, verify_file

__all__ = ["grad_health", "load", "save", "verify_file"]
