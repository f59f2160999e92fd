"""PyTorch integration: ``trainvigil.torch.watch(model, optimizer)``.

Importing this module imports torch (absolute import: this file never shadows it).
"""

from __future__ import annotations

from trainvigil.agents.torch_watch import Watch, watch

__all__ = ["Watch", "watch"]
