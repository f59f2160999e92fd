"""What user code hands to ``log()`` and ``event()``, turned into wire values or refused (pure).

A metric value becomes one float64, or ``None`` when it is not one number. Event fields
become MessagePack/JSON-like trees (``str``, ``int``, ``float``, ``bool``, ``None``, lists
and str-keyed dicts); NumPy and torch scalars turn into Python numbers and small arrays
into lists. Anything refused is named by its path so the agent can say what it dropped.
Nothing here raises: a value that breaks a conversion is refused like any other.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from trainvigil.schemas import KNOWN_METRICS, RunEvent
from trainvigil.schemas.limits import MAX_FIELDS_DEPTH, MAX_NAME

MAX_ITEMS = 1024
"""Elements in one array, tensor, list or dict of an event field."""
MAX_NODES = 10_000
"""Values in all the fields of one event."""
MAX_CHARS = 256 * 1024
"""Characters in all the strings (and dict keys) of one event's fields."""

_INT64_MIN, _INT64_END = -(2**63), 2**63
_UINT64_MAX = 2**64 - 1

SCALAR_TYPES: frozenset[type] = frozenset({float, int, bool, *(np.dtype(c).type for c in "?bBhHiIlLqQefd")})
"""Types NumPy converts to float64 exactly as ``float()`` does, without parsing or warnings."""

_REFUSED: Any = object()
"""What a conversion returns for a value it refuses (the reason is already recorded)."""


def as_float(value: Any) -> float | None:
    """``value`` as a float when it is one real number (Python, NumPy, a 1-element array or
    tensor, or anything with ``__float__``); ``None`` for anything else."""
    try:
        if isinstance(value, np.ndarray):
            if value.size != 1 or value.dtype.kind not in "biuf":
                return None
            return float(value.reshape(-1)[0])
        if isinstance(value, np.generic):
            return float(value) if isinstance(value, np.bool_ | np.integer | np.floating) else None
        cls = type(value)
        read = array_reader(cls)
        if read is not None:  # a torch tensor or a JAX array: item() raises unless it holds one element
            return float(read(value))  # and float() unless that is real
        if hasattr(cls, "__float__") or hasattr(cls, "__index__"):  # not str or bytes: float() would parse those
            return float(value)
    except Exception:  # a user's __float__ may raise anything; the value is refused, never the worker
        return None
    return None


_READERS: dict[type, Callable[[Any], Any] | None] = {}
""":func:`array_reader`'s answers by type."""


def array_reader(cls: type) -> Callable[[Any], Any] | None:
    """How to read the one element of a torch tensor (``item()``) or a JAX array (through NumPy, a third of
    what its ``float()`` costs); ``None`` for any other type. The agent reads a column of one such type
    with it in one pass (about 0.3 us a tensor, 1.3 us a JAX scalar, against 1.1 and 2.8 us value by value).

    The reader raises when the value holds more or fewer elements than one, and returns a complex for a
    complex one: callers refuse both.
    """
    if cls in _READERS:
        return _READERS[cls]
    read: Callable[[Any], Any] | None = None
    if _is_tensor(cls):  # the class has the methods its tensors have
        read = cls.item  # type: ignore[attr-defined]  # (mypy cannot see it through hasattr on _is_tensor)
    elif cls.__module__.partition(".")[0] in ("jax", "jaxlib") and hasattr(cls, "__array__"):
        read = _numpy_item
    _READERS[cls] = read
    return read


def _numpy_item(value: Any) -> Any:
    return np.asarray(value).item()


TYPO_CUTOFF = 0.8
"""How alike (difflib's ratio) a metric name must be to a known one to be taken for its typo: ``los``, ``Loss``
and ``grad_nrom`` are (0.86-1.0); ``l2`` and ``k1`` are not (0.5), whatever they resemble."""
MAX_NAMES_CHECKED = 1024
"""Distinct metric names a run's agent compares with the known ones; past them (a name per layer or per
step) new names go unchecked, so the set of names seen stays small."""


def resembles_known(name: str) -> str | None:
    """The known metric (``KNOWN_METRICS``) that ``name`` looks like a misspelling of, or ``None``.

    A name that holds a known one whole (``val_loss``, ``loss2``, ``kl_coef``) is taken as meant, and so
    is a known name itself; any other within :data:`TYPO_CUTOFF` of one, compared in lower case, is not.
    """
    if name in KNOWN_METRICS:
        return None
    lower = name.lower()
    if lower in KNOWN_METRICS:
        return lower
    close = difflib.get_close_matches(lower, [k for k in KNOWN_METRICS if k not in lower], n=1, cutoff=TYPO_CUTOFF)
    return close[0] if close else None


class MetricNames:
    """The metric names a run logged so far; says once per new name which known metric it resembles.

    Fed by the worker thread (never the training thread) with the column names of each packed batch.
    """

    def __init__(self, limit: int = MAX_NAMES_CHECKED) -> None:
        self._seen: set[str] = set(KNOWN_METRICS)
        self._limit = limit + len(KNOWN_METRICS)
        self._typos: list[tuple[str, str]] = []

    def add(self, names: Iterable[str]) -> None:
        for name in names:
            if name in self._seen or len(self._seen) >= self._limit:
                continue
            self._seen.add(name)
            known = resembles_known(name)
            if known is not None:
                self._typos.append((name, known))

    def take_typos(self) -> list[tuple[str, str]]:
        """(name, the known metric it resembles) for each name not handed out yet."""
        typos, self._typos = self._typos, []
        return typos


def as_step(value: Any) -> int | None:
    """``value`` as an int64 step, or ``None`` when it is not an integer (``bool`` is not)."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        step = int(value)
        if _INT64_MIN <= step < _INT64_END:
            return step
    return None


def utf8(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (lone surrogates, as from undecodable file names, do not)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def wire_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, undecodable characters escaped: always valid on the wire."""
    if not utf8(text):
        text = text.encode(errors="backslashreplace").decode()
    return text[:limit]


def describe(value: Any) -> str:
    """A short description of ``value`` for a log line (type and shape, or a clipped repr)."""
    try:
        if isinstance(value, np.ndarray):
            return f"ndarray of shape {value.shape} and dtype {value.dtype}"
        if _is_tensor(value):
            return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
        text = repr(value)
        text = text if len(text) <= 40 else text[:37] + "..."
        return text if type(value).__name__ in text else f"{type(value).__name__} {text}"
    except Exception:
        return f"a {type(value).__name__}"


def make_event(now: float, kind: Any, step: Any, fields: Mapping[str, Any]) -> tuple[RunEvent, list[tuple[str, str]]]:
    """The :class:`RunEvent` for ``agent.event(kind, step=step, **fields)``, and what was
    refused as (reason, description) pairs: ``bad_step`` (the event goes out without its
    step) and ``bad_field`` (that field, dict entry or list element is left out; a list
    keeps its length with ``None`` in the element's place)."""
    refused: list[tuple[str, str]] = []
    if type(kind) is not str:
        try:
            kind = str(kind)
        except Exception:
            refused.append(("bad_field", f"event kind {describe(kind)}: str() failed"))
            kind = type(kind).__name__
    if len(kind) > MAX_NAME:
        refused.append(("bad_field", f"event kind {kind[:40]!r}...: cut to {MAX_NAME} characters"))
    kind = wire_text(kind, MAX_NAME)
    where = f"event {kind!r}"
    good_step = as_step(step)
    if step is not None and good_step is None:
        refused.append(("bad_step", f"{where}: step {describe(step)} is not an int"))
    where = where if good_step is None else f"{where} at step {good_step}"
    return RunEvent(time=now, kind=kind, step=good_step, fields=clean_fields(where, fields, refused)), refused


def clean_fields(where: str, fields: Mapping[str, Any], refused: list[tuple[str, str]]) -> dict[str, Any]:
    """``fields`` as wire values (an event's fields, a run's config), within one event's size budget;
    what is left out goes to ``refused`` as (``bad_field``, description naming ``where``)."""
    cleaner = _Cleaner(where, refused)
    out: dict[str, Any] = {}
    for name, value in fields.items():
        # Level 2: the fields dict itself is the first level of nesting the wire counts.
        clean = cleaner.clean(value, 2, name) if utf8(name) else cleaner.refuse(name, "has a name that is not UTF-8")
        if clean is not _REFUSED:
            out[name] = clean
    return out


def _is_tensor(value: Any) -> bool:
    """A torch tensor, recognised without importing torch."""
    return hasattr(value, "detach") and hasattr(value, "numel") and hasattr(value, "tolist")


class _Cleaner:
    """One event's fields: converts value by value while the size budget lasts."""

    def __init__(self, where: str, refused: list[tuple[str, str]]) -> None:
        self.where = where
        self.refused = refused
        self.nodes = MAX_NODES
        self.chars = MAX_CHARS

    def refuse(self, path: str, why: str) -> Any:
        self.refused.append(("bad_field", f"{self.where}: field {path!r} {why}"))
        return _REFUSED

    def clean(self, value: Any, level: int, path: str) -> Any:
        """``value`` as a wire value, or :data:`_REFUSED` (recorded with ``path``); ``level`` is
        the nesting level ``value`` would have as a container (the wire allows at most
        :data:`~trainvigil.schemas.limits.MAX_FIELDS_DEPTH`)."""
        self.nodes -= 1
        if self.nodes < 0:
            return self.refuse(path, f"is past the {MAX_NODES} values one event may hold")
        cls = type(value)
        if value is None or cls is bool or cls is float:
            return value
        if cls is int:
            return value if _INT64_MIN <= value <= _UINT64_MAX else self.refuse(path, "is an int beyond 64 bits")
        if cls is str:
            return self._text(value, path)
        try:
            return self._other(value, level, path)
        except Exception as exc:  # a user type that breaks a conversion: refused, never raised
            return self.refuse(path, f"({describe(value)}) could not be converted: {exc!r}")

    def _text(self, value: str, path: str) -> Any:
        self.chars -= len(value)
        if self.chars < 0:
            return self.refuse(path, f"is past the {MAX_CHARS} characters one event may hold")
        if not utf8(value):
            return self.refuse(path, "is a string that is not UTF-8")
        return value

    def _other(self, value: Any, level: int, path: str) -> Any:
        if isinstance(value, bool | np.bool_):
            return bool(value)
        if isinstance(value, int | np.integer):
            number = int(value)  # an IntEnum or a NumPy int: a plain int
            return number if _INT64_MIN <= number <= _UINT64_MAX else self.refuse(path, "is an int beyond 64 bits")
        if isinstance(value, float | np.floating):
            return float(value)  # float subclasses and float16..longdouble
        if isinstance(value, str):
            return self._text(str(value), path)
        if isinstance(value, np.ndarray) or _is_tensor(value):
            return self._array(value, level, path)
        if level > MAX_FIELDS_DEPTH:
            return self.refuse(path, f"is nested deeper than the {MAX_FIELDS_DEPTH} levels the wire takes")
        if isinstance(value, list | tuple):
            if len(value) > MAX_ITEMS:
                return self.refuse(path, f"has {len(value)} elements (at most {MAX_ITEMS})")
            items = [self.clean(item, level + 1, f"{path}[{i}]") for i, item in enumerate(value)]
            return [None if item is _REFUSED else item for item in items]
        if isinstance(value, Mapping):
            return self._mapping(value, level, path)
        return self.refuse(path, f"({describe(value)}) is not a number, string, list or dict")

    def _array(self, value: Any, level: int, path: str) -> Any:
        """A NumPy array or torch tensor of numbers (or NumPy strings) as nested lists."""
        size = int(value.size if isinstance(value, np.ndarray) else value.numel())
        if size > MAX_ITEMS:
            return self.refuse(path, f"({describe(value)}) has more than {MAX_ITEMS} elements")
        if level + value.ndim - 1 > MAX_FIELDS_DEPTH:  # one list level per dimension
            return self.refuse(path, f"({describe(value)}) is nested deeper than the wire takes")
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biufU":
                return self.refuse(path, f"({describe(value)}) holds no numbers")
            if value.dtype.kind == "U":
                self.chars -= size * value.dtype.itemsize // 4
            elif value.dtype.kind == "f" and value.dtype.itemsize > 8:
                value = value.astype(np.float64)  # tolist() would keep longdouble scalars
        elif value.is_complex():
            return self.refuse(path, f"({describe(value)}) holds complex numbers")
        else:
            value = value.detach().cpu()
        self.nodes -= size
        if self.nodes < 0 or self.chars < 0:
            return self.refuse(path, "is past the size one event may hold")
        # tolist() gives Python bools, ints within 64 bits, floats and str: wire values as they are.
        return value.tolist()

    def _mapping(self, value: Mapping[Any, Any], level: int, path: str) -> Any:
        if len(value) > MAX_ITEMS:
            return self.refuse(path, f"has {len(value)} entries (at most {MAX_ITEMS})")
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, str):
                name = str(key)
            elif isinstance(key, int | np.integer) and not isinstance(key, bool):
                name = str(int(key))  # JSON's way with int keys
            else:
                self.refuse(f"{path}[{describe(key)}]", "has a key that is not a string")
                continue
            if self._text(name, f"{path}.{name}") is _REFUSED:
                continue
            clean = self.clean(item, level + 1, f"{path}.{name}")
            if clean is not _REFUSED:
                out[name] = clean
        return out
