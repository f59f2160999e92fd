"""What the drop-in shims (``trainvigil.wandb``, ``trainvigil.tensorboard``) share: one logged dict as an agent
row, with the detectors' names added and the values that are not numbers left out and counted.

Runs on the training thread, so it only looks things up: a name's detector name and a type's verdict (number
or not) are computed once and cached; values are not read (a tensor stays a tensor for the agent's thread).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainvigil.agents._names import detector_name
from trainvigil.agents._values import SCALAR_TYPES, array_reader, describe

_NUMERIC: dict[type, bool] = {}
""":func:`numeric_type`'s answers by type."""


def numeric_type(cls: type) -> bool:
    """Whether values of ``cls`` may be numbers the agent reads (the agent still refuses an array of many)."""
    verdict = _NUMERIC.get(cls)
    if verdict is None:
        if cls in SCALAR_TYPES:
            verdict = True
        elif issubclass(cls, str | bytes | Mapping) or cls is complex:
            verdict = False
        elif issubclass(cls, np.generic):
            verdict = issubclass(cls, np.bool_ | np.integer | np.floating)
        elif issubclass(cls, np.ndarray) or array_reader(cls) is not None:
            verdict = True
        else:
            verdict = hasattr(cls, "__float__") or hasattr(cls, "__index__")
        _NUMERIC[cls] = verdict
    return verdict


class Rows:
    """Turns a shim's logged values into agent rows; counts what it leaves out (``dropped``, by name).

    Args:
        who: the shim's name, for its log lines (``trainvigil.wandb``).
        names: a user's own ``{name: detector name}`` (``-name``: negated), looked up before the built-in ones.
    """

    def __init__(self, who: str, names: Mapping[str, str] | None = None) -> None:
        self.who = who
        self.dropped: dict[str, int] = {}
        """Values left out, by name (images, tables, strings: anything but numbers)."""
        self._names = dict(names or {})
        self._plans: dict[str, tuple[str | None, bool]] = {}
        """:func:`detector_name`'s answer per name logged, looked up once."""
        self._log = logging.getLogger(who)

    def row(self, values: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
        """``values`` under their own names, plus the detectors' name of each name that has one (a value logged
        under the detectors' name itself wins). Nested dicts become ``outer.inner`` names, as W&B shows them."""
        out: dict[str, Any] = {}
        for key, value in values.items():
            name = key if type(key) is str else str(key)
            self.add(out, prefix + name if prefix else name, value)
        return out

    def add(self, out: dict[str, Any], name: str, value: Any) -> None:
        """Put one logged value into the row ``out`` (see :meth:`row`)."""
        # Two cached lookups, a value's type and its name: this runs per value on the training thread.
        numeric = _NUMERIC.get(type(value))
        if numeric is None:
            numeric = numeric_type(type(value))
        if not numeric:
            if isinstance(value, Mapping):
                for key, inner in value.items():
                    self.add(out, f"{name}.{key}", inner)
            else:
                self.drop(name, value)
            return
        out[name] = value
        plan = self._plans.get(name)
        if plan is None:
            plan = self._plans[name] = detector_name(name, self._names)
        target = plan[0]
        if target is not None and target not in out:
            if plan[1]:
                try:
                    value = -value
                except Exception:  # a user's number type without negation: only its own name keeps it
                    return
            out[target] = value

    def drop(self, name: str, value: Any, why: str = "only numbers reach trainvigil") -> None:
        """Count a value left out; the first of each name says so once."""
        seen = self.dropped.get(name, 0)
        self.dropped[name] = seen + 1
        if not seen:
            self._log.warning(
                "%s: dropped %r (%s): %s; further ones are counted (dropped[%r])",
                self.who, name, describe(value), why, name,
            )  # fmt: skip
