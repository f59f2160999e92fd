"""Settings shared by the agent and the daemon: ``VIGIL_*`` names derived from Struct fields, and one retry policy.

Both sides describe their settings as frozen msgspec Structs with ``Meta`` constraints. Every
field has an environment name: ``VIGIL_`` + its key path upper-cased and joined with ``_``
(``stream.max_age_s`` → ``VIGIL_STREAM_MAX_AGE_S``); :func:`from_env` reads those, and
:func:`convert` checks the merged values against the Struct, turning environment strings into
numbers, booleans and paths.

Not wire types: this module sits in ``schemas`` because it is the one place both the agent and
the daemon may import.
"""

from __future__ import annotations

import difflib
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args, get_origin

import msgspec

ENV_PREFIX = "VIGIL_"

MAX_WAIT_S = 86_400.0
"""A day: the upper bound of every timeout, interval and wait setting, the agent's and the daemon's. Longer is
a typo or a hostile value, and one like ``1e300`` overflows the event loop's timers and JetStream's nanoseconds."""
MAX_RETENTION_S = 10 * 365 * 86_400.0
"""Ten years: the upper bound of how long a setting may keep data (``stream.max_age_s``, where 0 means no limit)."""
MAX_BYTES = 2**50
"""1 PiB: the upper bound of every size setting in bytes."""
MAX_COUNT = 2**31 - 1
"""The upper bound of every count setting (buffered steps, messages in flight, rows, queue entries)."""

Seconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_WAIT_S, description="seconds, > 0 and at most a day")]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_BYTES, description="bytes, at most 1 PiB")]
Count = Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT, description="a count >= 1, at most 2**31 - 1")]

KeyPath = tuple[str, ...]
S = TypeVar("S", bound=msgspec.Struct)


def env_name(path: KeyPath) -> str:
    """The environment variable of the key at ``path``: ``("stream", "max_age_s")`` → ``VIGIL_STREAM_MAX_AGE_S``."""
    return ENV_PREFIX + "_".join(path).upper()


def env_names(struct: type[msgspec.Struct], path: KeyPath = ()) -> dict[str, KeyPath]:
    """``VIGIL_*`` name → the path of the key it sets, for every field of ``struct`` (nested Structs too)."""
    names: dict[str, KeyPath] = {}
    for field in msgspec.structs.fields(struct):
        key = (*path, field.name)
        if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            names.update(env_names(field.type, key))
        else:
            names[env_name(key)] = key
    return names


def set_path(tree: dict[str, Any], path: KeyPath, value: Any) -> None:
    """``tree[path[0]][path[1]]... = value``, making the tables on the way."""
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def from_env(
    struct: type[msgspec.Struct],
    env: Mapping[str, str],
    tree: dict[str, Any] | None = None,
    skip: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """``tree`` (a new one by default) with every non-empty ``VIGIL_*`` variable of ``struct``'s keys set in it,
    as a string; the top-level keys in ``skip`` are left alone."""
    tree = {} if tree is None else tree
    for name, path in env_names(struct).items():
        if path[0] not in skip and env.get(name, "") != "":
            set_path(tree, path, env[name])
    return tree


def _decode_extra(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str | Path):
        return Path(value)
    raise NotImplementedError(f"cannot read {kind.__name__} from {type(value).__name__}")


def convert(tree: Mapping[str, Any], struct: type[S]) -> S:
    """``tree`` checked and converted into ``struct``; strings become numbers, booleans and paths.

    Raises:
        msgspec.ValidationError: a value has the wrong type or breaks a ``Meta`` constraint;
            the message names the key (``at `$.stream.max_age_s```); an unknown key, the closest known one.
    """
    try:
        return msgspec.convert(tree, struct, strict=False, dec_hook=_decode_extra)
    except msgspec.ValidationError as exc:
        hint = _closest_key(str(exc), struct)
        if not hint:
            raise
        raise msgspec.ValidationError(f"{exc}{hint}") from None


def did_you_mean(value: str, valid: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` with the valid value closest to ``value``, or ``""`` when none is close."""
    close = difflib.get_close_matches(value, list(valid), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


_UNKNOWN_KEY = re.compile(r"unknown field `(?P<key>[^`]+)` - at `\$(?P<path>[^`]*)`")
_STEPS = re.compile(r"\.(\w+)|\[(\d+)\]")


def path_steps(path: str) -> list[tuple[str, str]]:
    """The steps of msgspec's error path (``$.canary.jobs[1].name``): ``(field, "")`` or ``("", index)`` each."""
    return _STEPS.findall(path)


def field_type_at(struct: type[msgspec.Struct], path: str) -> Any:
    """The declared type, ``Annotated`` and its ``Meta`` kept, of the field at msgspec's error path ``path`` (e.g.
    ``$.canary.jobs[1].name``) of ``struct``; ``None`` when the path leaves the Structs."""
    tp: Any = struct
    for name, index in path_steps(path):
        tp = _unwrap(tp)
        tp = _item_type(tp) if index else _field_type(tp, name)
        if tp is None:
            return None
    return tp


def _closest_key(message: str, struct: type[msgspec.Struct]) -> str:
    """For msgspec's "unknown field `k` - at `$.a.b`": the closest key of the table at ``a.b``, or ``""``."""
    found = _UNKNOWN_KEY.search(message)
    if not found:
        return ""
    table = _unwrap(field_type_at(struct, found["path"]))
    if not (isinstance(table, type) and issubclass(table, msgspec.Struct)):
        return ""
    return did_you_mean(found["key"], (f.encode_name for f in msgspec.structs.fields(table)))


def _unwrap(tp: Any) -> Any:
    """``tp`` without ``Annotated``, and a Struct out of a union (``X | list[X]``) when there is one."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    args = get_args(tp)
    if args and get_origin(tp) not in (list, tuple, dict):
        structs = [a for a in args if isinstance(a, type) and issubclass(a, msgspec.Struct)]
        return structs[0] if structs else tp
    return tp


def _field_type(struct: Any, name: str) -> Any:
    if not (isinstance(struct, type) and issubclass(struct, msgspec.Struct)):
        return None
    field = next((f for f in msgspec.structs.fields(struct) if f.encode_name == name), None)
    return None if field is None else field.type


def _item_type(tp: Any) -> Any:
    args = get_args(tp)
    return args[0] if get_origin(tp) in (list, tuple) and args else None


def retrying(
    on: Any, *, attempts: int | None, wait_initial: float, wait_max: float, timeout: float | None = None
) -> Any:
    """trainvigil's one retry policy (``[async] for attempt in retrying(...): with attempt: ...``).

    Exponential backoff from ``wait_initial`` seconds, doubling up to ``wait_max``, with up to
    ``wait_initial`` of jitter so that many agents do not retry in step; ``attempts`` in all
    (``None``: until it succeeds, the caller is cancelled or ``timeout`` seconds passed, after
    which the last error is raised; without ``timeout`` the caller's own deadline ends it).
    ``on``: the exceptions to retry, or stamina's predicate. ``stamina.set_testing(True)`` turns
    the backoff off in tests. The daemon's side: stamina comes with the ``daemon`` extra.
    """
    # Imported here, not with the module: the agent imports this module (for quiet_backoff) and its install
    # has no stamina (nor tenacity under it).
    import stamina

    return stamina.retry_context(
        on=on,
        attempts=attempts,
        timeout=timeout,
        wait_initial=wait_initial,
        wait_max=wait_max,
        wait_jitter=wait_initial,
        wait_exp_base=2,
    )


def quiet_backoff(wait_initial: float, wait_max: float) -> Iterator[float]:
    """The waits of :func:`retrying`'s policy, endless, for the agent's retries: stamina reports every retry
    through structlog, which prints to the standard output of a process that did not configure it, and the
    agent lives in the user's training script (it says what matters once, on the ``trainvigil.agent`` logger)."""
    wait = wait_initial
    while True:
        yield wait + random.uniform(0, wait_initial)
        wait = min(2 * wait, wait_max)
