"""``vigil verify PATH``: check a checkpoint against the manifest written beside it.

Exit codes: 0 the content matches; 1 it does not (the differing tensors are listed), or the
file is missing or cannot be read; 2 there is no manifest; 3 torch is not installed (flax, for a file
``trainvigil.jax.save`` wrote: its manifest says so). Needs only the agent install and torch (no
daemon extra).

What a manifest or a checkpoint names (tensor names, digests, error text) is printed through
:func:`~trainvigil.schemas.terminal.terminal_safe`: either file may come from someone else, and an escape
sequence in a name would otherwise reach the terminal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainvigil.schemas.terminal import terminal_safe

EXIT_MATCH, EXIT_MISMATCH, EXIT_NO_MANIFEST, EXIT_NO_TORCH = 0, 1, 2, 3


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verify = sub.add_parser(
        "verify",
        help="check a checkpoint against its manifest (<path>.vigil.json)",
        description="Load a checkpoint saved with trainvigil.checkpoint.save() and compare every tensor's "
        "digest with its manifest (differing tensors listed). With the daemon extra, it then says which run and "
        "step saved the "
        "manifest's content, from the daemon's checkpoint registry (vigil checkpoints).",
    )
    verify.add_argument("path", help="the checkpoint file")
    verify.add_argument(
        "--full-unpickle",
        action="store_true",
        help="load with weights_only=False (only for files you trust: unpickling runs code)",
    )
    verify.add_argument("--data-dir", help="the daemon's data directory, for who saved it (default ./vigil-data)")
    verify.add_argument("--nats", dest="nats_url", help="broker of the daemon (default VIGIL_NATS_URL or local)")
    verify.add_argument("--config", help="the daemon's TOML configuration file")
    verify.add_argument("--creds", dest="nats_creds", metavar="FILE", help="a reader's credentials file")
    verify.add_argument("--namespace", metavar="NAME", help="the namespace of that daemon (VIGIL_NAMESPACE)")


def run(args: argparse.Namespace) -> int:
    if not Path(args.path).is_file():  # before torch: a wrong path needs no torch to say so
        what = "is not a file" if Path(args.path).exists() else "does not exist"
        print(f"vigil verify: {args.path} {what}; check the path to the checkpoint", file=sys.stderr)
        return EXIT_MISMATCH
    from trainvigil.agents.checkpoint import read_codec
    from trainvigil.errors import ManifestMissingError

    try:
        codec = read_codec(args.path)
    except ManifestMissingError as exc:
        print(f"vigil verify: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_NO_MANIFEST
    try:
        if codec == "flax-msgpack":  # written by trainvigil.jax.save: needs flax, not torch
            from trainvigil.agents.integrations.jax import verify_file as verify_flax

            result, _ = verify_flax(args.path)
        else:
            import torch  # noqa: F401

            from trainvigil.agents.checkpoint import verify_file

            result, _ = verify_file(args.path, weights_only=not args.full_unpickle)
    except ImportError as exc:
        extra = "the jax and flax packages" if codec == "flax-msgpack" else "torch: pip install 'trainvigil[torch]'"
        print(f"vigil verify: needs {extra} ({exc})", file=sys.stderr)
        return EXIT_NO_TORCH
    except Exception as exc:  # the file could not be read back: a truncated or garbled file is a mismatch too
        why = terminal_safe(f"{type(exc).__name__}: {exc}")
        print(
            f"vigil verify: {args.path} cannot be read ({why}); the file is corrupt, "
            "or holds objects beyond tensors (retry with --full-unpickle if you trust it)",
            file=sys.stderr,
        )
        return EXIT_MISMATCH
    if result.ok:
        what = terminal_safe(f"{result.actual.algo} {result.actual.root}")
        print(f"{args.path}: OK ({len(result.actual.entries)} entries, {what})")
        return EXIT_MATCH
    differing = result.differing
    print(f"{args.path}: MISMATCH in {len(differing)} of {len(result.expected.entries)} entries")
    for name in differing:
        want = result.expected.entries.get(name, "(absent)")
        got = result.actual.entries.get(name, "(absent)")
        print(terminal_safe(f"  {name}: expected {want[:16]} got {got[:16]}"))
    print("restore the file from another copy or an earlier checkpoint", file=sys.stderr)
    return EXIT_MISMATCH
