"""Fault injection for canary runs: ``VIGIL_FAULT=<kind>@<step>[,<kind>@<step>]`` breaks real training.

The public name of :mod:`trainvigil.agents.faults`, whose ``__all__`` this module offers as it is, the same
objects: ``from trainvigil.faults import parse, armed``. A module of its own because ``trainvigil.faults``
must import as a module (``import trainvigil.faults``), and mapping the package's folder onto a second name
would load its plan twice, with two armed states.
"""

from trainvigil.agents.faults import *  # noqa: F403  (the package's __all__ is this module's surface)
from trainvigil.agents.faults import __all__ as __all__
