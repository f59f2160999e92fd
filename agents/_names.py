"""The agent's name for :mod:`trainvigil.schemas.names`, the mapping the shims and the web view share."""

from trainvigil.schemas.names import DETECTOR_NAMES, detector_name

__all__ = ["DETECTOR_NAMES", "detector_name"]
