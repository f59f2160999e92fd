"""Checkpoint integrity: digests written beside a checkpoint and checked when it is loaded.

``save(obj, path)`` writes ``torch.save``'s file and a manifest ``<path>.vigil.json`` with
one digest per leaf and a root. ``load(path)`` reads the file back, recomputes the digests
and raises :class:`~trainvigil.errors.CheckpointIntegrityError` naming the leaves that
differ. Both report to the process's current agent (if any) as ``CheckpointDigest``
records, so the daemon can compare a load with the save of the same path.

``digest_later`` serves ``Agent.checkpoint_saved``: it returns a future at once and hashes
on a background thread. The rule for tensors the caller may change afterwards:

* ``snapshot=True`` (default): the tensors are cloned before the call returns (on an
  accelerator the clone is queued on the current stream, so the training thread does not
  wait; on CPU it is a memory copy), and the clones are hashed in the background. Costs
  one extra copy of the state while hashing.
* ``snapshot=False``: the live tensors are hashed in the background; the caller must not
  change them until the future is done. A tensor changed meanwhile is detected (its
  version counter moved) and the digest is discarded rather than published wrong.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainvigil.errors import CheckpointIntegrityError, ManifestMissingError
from trainvigil.schemas import CheckpointDigest
from trainvigil.schemas.inputs import InputRefusedError, read_input

from . import _current, faults
from .digest import StateDigest, digest, leaves
from .faults.hooks import corrupt_saved

log = logging.getLogger("trainvigil.checkpoint")

MANIFEST_SUFFIX = ".vigil.json"
MANIFEST_FORMAT = "trainvigil-checkpoint-manifest/1"
MAX_MANIFEST_BYTES = 256 * 2**20
"""The largest manifest read back: one digest per tensor is ~150 bytes, so over a million tensors."""


def manifest_path(path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(path)}{MANIFEST_SUFFIX}")


CODECS = ("torch", "flax-msgpack")
"""How a checkpoint file was written: ``torch.save``, or Flax's msgpack serialization (``trainvigil.jax``)."""


def write_manifest(path: str | os.PathLike[str], d: StateDigest, step: int | None = None, codec: str = "torch") -> Path:
    """Write ``<path>.vigil.json`` atomically (a reader never sees half a manifest).

    Checkpoints often go to a directory others write to too. The manifest is written first under a new random
    name (``mkstemp``: ``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600), so a link planted at a name it could take
    is never written through, then given the checkpoint's permissions and renamed over ``<path>.vigil.json``
    (a rename replaces a link there, never follows it).
    """
    target = manifest_path(path)
    body = {"format": MANIFEST_FORMAT, "algo": d.algo, "root": d.root, "step": step, "entries": d.entries}
    if codec != "torch":  # a manifest without it is a torch file's, as every manifest before was
        body["codec"] = codec
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(body, indent=1))
            with contextlib.suppress(OSError):  # no checkpoint to match (gone meanwhile): it stays 0600
                os.fchmod(out.fileno(), stat.S_IMODE(os.stat(path).st_mode) & 0o666)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def _manifest_body(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of the manifest of ``path``, read only from a regular file of at most
    :data:`MAX_MANIFEST_BYTES` (a FIFO or a link to ``/dev/zero`` there would never end).

    Raises:
        ManifestMissingError: no manifest, or it cannot be read.
    """
    target = manifest_path(path)
    try:
        body = json.loads(read_input(target, max_bytes=MAX_MANIFEST_BYTES, follow_symlinks=True))
    except FileNotFoundError:
        raise ManifestMissingError(
            f"{path} has no manifest ({target.name}); save it with trainvigil.checkpoint.save() to verify it later"
        ) from None
    except InputRefusedError as exc:
        raise ManifestMissingError(f"{exc}; a manifest is the file trainvigil.checkpoint.save() writes") from None
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep to decode
        raise ManifestMissingError(f"manifest {target} cannot be read ({exc}); save the checkpoint again") from None
    if not isinstance(body, dict):
        raise ManifestMissingError(f"manifest {target} is not a JSON object; save the checkpoint again")
    return body


def read_codec(path: str | os.PathLike[str]) -> str:
    """How the checkpoint at ``path`` was written, from its manifest (``torch`` when it does not say).

    Raises:
        ManifestMissingError: no manifest, or it cannot be read.
    """
    codec = _manifest_body(path).get("codec", "torch")
    return codec if codec in CODECS else "torch"


def read_manifest(path: str | os.PathLike[str]) -> tuple[StateDigest, int | None]:
    """The digests saved beside ``path`` and the step they were saved at.

    Raises:
        ManifestMissingError: no manifest, or it cannot be read.
    """
    body = _manifest_body(path)
    try:
        if body.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unknown format {body.get('format')!r}")
        entries = dict(body["entries"])
        if not all(isinstance(v, str) for v in entries.values()):
            raise ValueError("its entries must map names to digests (text)")
        d = StateDigest(algo=str(body["algo"]), root=str(body["root"]), entries=entries)
        return d, body.get("step")
    except (ValueError, KeyError, TypeError) as exc:
        target = manifest_path(path)
        raise ManifestMissingError(f"manifest {target} cannot be read ({exc}); save the checkpoint again") from exc


@dataclass(frozen=True, slots=True)
class Verification:
    """The result of checking a loaded object against its manifest."""

    path: str
    expected: StateDigest
    actual: StateDigest
    step: int | None

    @property
    def ok(self) -> bool:
        return self.expected.root == self.actual.root

    @property
    def differing(self) -> list[str]:
        return self.expected.differing(self.actual)


def digest_record(d: StateDigest, path: str, step: int | None, origin: str, ok: bool = True) -> CheckpointDigest:
    return CheckpointDigest(
        time=time.time(),
        step=step,
        algo=d.algo,
        root=d.root,
        tensors=d.entries,
        path=os.path.abspath(path) if path else "",
        origin=origin,  # type: ignore[arg-type]
        ok=ok,
    )


def saved_record(d: StateDigest, path: str, step: int | None) -> CheckpointDigest:
    """The record ``Agent.checkpoint_saved`` publishes."""
    return digest_record(d, path, step, "save")


def save(
    obj: Any,
    path: str | os.PathLike[str],
    *,
    step: int | None = None,
    algo: str = "blake3",
    threads: int | None = None,
    **torch_save_kwargs: Any,
) -> StateDigest:
    """``torch.save(obj, path)``, then digest ``obj`` and write ``<path>.vigil.json``.

    Hashing happens here, before returning, so the manifest describes exactly what was
    written even if training changes the tensors right after (parallel threads; BLAKE3
    hashes several GB/s). The current agent, if any, publishes the digest (origin ``save``).
    """
    import torch

    torch.save(obj, path, **torch_save_kwargs)
    d = digest(obj, algo, threads=threads)
    write_manifest(path, d, step)
    agent = _current.get()
    if agent is not None:
        agent.publish(digest_record(d, os.fspath(path), step, "save"))
    plan = faults.armed()  # None unless VIGIL_FAULT armed one
    if plan is not None:
        corrupt_saved(plan, path, step)
    return d


def verify_file(
    path: str | os.PathLike[str], obj: Any = None, *, threads: int | None = None, **torch_load_kwargs: Any
) -> tuple[Verification, Any]:
    """Check ``path`` against its manifest; returns the verification and the loaded object.

    ``obj`` skips loading when the caller already has it. ``torch_load_kwargs`` go to
    ``torch.load`` (default ``map_location="cpu"``).

    Raises:
        ManifestMissingError: there is no manifest to check against.
    """
    expected, step = read_manifest(path)
    if obj is None:
        import torch

        torch_load_kwargs.setdefault("map_location", "cpu")
        obj = torch.load(path, **torch_load_kwargs)
    actual = digest(obj, expected.algo, threads=threads)
    return Verification(os.fspath(path), expected, actual, step), obj


def load(path: str | os.PathLike[str], verify: bool = True, **torch_load_kwargs: Any) -> Any:
    """``torch.load(path)``; with ``verify`` check it against ``<path>.vigil.json`` first.

    The current agent, if any, publishes the verification (origin ``load``, ``ok``).

    Raises:
        CheckpointIntegrityError: the content differs from the manifest (names the leaves).
        ManifestMissingError: ``verify`` and no manifest beside the file.
    """
    if not verify:
        import torch

        return torch.load(path, **torch_load_kwargs)
    result, obj = verify_file(path, **torch_load_kwargs)
    agent = _current.get()
    if agent is not None:
        agent.publish(digest_record(result.actual, os.fspath(path), result.step, "load", ok=result.ok))
    if not result.ok:
        raise CheckpointIntegrityError(os.fspath(path), result.differing)
    return obj


def _snapshot(state: Any) -> tuple[Any, Any]:
    """Clone every tensor in ``state`` (same nesting); an event marks when accelerator clones are done."""
    import torch

    event = None

    def clone(x: Any) -> Any:
        nonlocal event
        if isinstance(x, torch.Tensor):
            c = x.detach().clone()
            if c.is_cuda and event is None:
                event = torch.cuda.Event()
            return c
        if isinstance(x, dict):
            return {k: clone(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return type(x)(clone(v) for v in x) if not hasattr(x, "_fields") else type(x)(*map(clone, x))
        return x

    copy = clone(state)
    if event is not None:
        event.record()  # after every clone queued on this thread's current stream
    return copy, event


def _versions(state: Any) -> dict[str, int]:
    import torch

    return {n: int(t._version) for n, t in leaves(state) if isinstance(t, torch.Tensor)}


def digest_later(
    state: Any, *, algo: str = "blake3", snapshot: bool = True, threads: int | None = None
) -> Future[StateDigest]:
    """Digest ``state`` on a background thread; the future resolves to the digest.

    See the module docstring for the ``snapshot`` rule. A tensor changed during an
    unsnapshotted digest makes the future fail with ``CheckpointIntegrityError``.
    """
    future: Future[StateDigest] = Future()
    if snapshot:
        state, event = _snapshot(state)
        before = None
    else:
        event, before = None, _versions(state)

    def work() -> None:
        try:
            if event is not None:
                event.synchronize()
            d = digest(state, algo, threads=threads)
            if before is not None:
                moved = sorted(n for n, v in _versions(state).items() if before.get(n) != v)
                if moved:
                    raise CheckpointIntegrityError(
                        "<in memory>", moved, "tensors changed while being hashed; pass snapshot=True"
                    )
            future.set_result(d)
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=work, name="trainvigil-digest", daemon=True).start()
    return future


__all__ = [
    "MANIFEST_SUFFIX",
    "StateDigest",
    "Verification",
    "digest",
    "digest_later",
    "load",
    "manifest_path",
    "read_manifest",
    "save",
    "saved_record",
    "verify_file",
    "write_manifest",
]
