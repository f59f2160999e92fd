"""Checkpoint integrity: digests, manifests beside checkpoints, verification on load.

::

    from trainvigil import checkpoint
    checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict()}, "ckpt.pt", step=step)
    state = checkpoint.load("ckpt.pt")          # raises CheckpointIntegrityError on a mismatch
    d = checkpoint.digest(model.state_dict())  # StateDigest(algo, root, entries)
"""

from __future__ import annotations

from trainvigil.agents.checkpoint import (
    MANIFEST_SUFFIX,
    Verification,
    digest_later,
    load,
    manifest_path,
    read_manifest,
    save,
    verify_file,
)
from trainvigil.agents.digest import StateDigest, digest
from trainvigil.errors import CheckpointIntegrityError, ManifestMissingError

__all__ = [
    "MANIFEST_SUFFIX",
    "CheckpointIntegrityError",
    "ManifestMissingError",
    "StateDigest",
    "Verification",
    "digest",
    "digest_later",
    "load",
    "manifest_path",
    "read_manifest",
    "save",
    "verify_file",
]
