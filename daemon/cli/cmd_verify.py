"""``vigil verify``: check a checkpoint against its manifest, then say which run and step saved that content.

The check itself is the agent's (``trainvigil.agents.verify``: it needs torch, not the daemon extra, and runs where
training ran); who saved the content is asked of the daemon's checkpoint registry when there is one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainvigil.agents import verify
from trainvigil.daemon.cli._config import reader
from trainvigil.schemas.terminal import terminal_safe


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verify.add_parser(sub)
    sub.choices["verify"].set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    code = verify.run(args)
    if code in (verify.EXIT_MATCH, verify.EXIT_MISMATCH) and Path(args.path).is_file():
        _saved_by(args)
    return code


def _saved_by(args: argparse.Namespace) -> None:
    """Which run and step saved the manifest's content, if the daemon knows it. Best effort: without the daemon
    extra, or with no history to ask, it says why in one line."""
    from trainvigil.agents.checkpoint import read_manifest

    try:
        from trainvigil.daemon.cli.cmd_checkpoints import writer_sql
        from trainvigil.daemon.cli.sqlclient import query

        expected, _ = read_manifest(args.path)
        cfg, url, bus = reader(args)
        result, _ = query(
            writer_sql(expected.root),
            nats_url=url,
            data_dir=cfg.data_dir,
            limit=5,
            timeout=10,
            access=bus,
            subjects=cfg.subjects,
        )
    except Exception as exc:  # no daemon extra, no daemon and no file, refused credentials: verify's verdict stands
        print(
            f"vigil verify: who saved it is unknown ({type(exc).__name__}: {terminal_safe(str(exc))})", file=sys.stderr
        )
        return
    if not result.rows:
        print(f"{args.path}: no save with this content ({expected.algo} {expected.root[:16]}) is in the history")
        return
    run_id, rank, step, saved_at, path = result.rows[0]
    others = f" (and {len(result.rows) - 1} more saves of the same content)" if len(result.rows) > 1 else ""
    # The run and the path come from the history, that is from an agent: shown as text.
    saved = terminal_safe(f"run {run_id} rank {rank} at step {step} ({saved_at}, as {path}){others}")
    print(f"{args.path}: saved by {saved}")
