"""``vigil checkpoints [RUN]``: the checkpoint registry. Every checkpoint the daemon has seen saved or loaded,
with what its loads proved and where it came from; and which run wrote a file (``vigil verify`` asks).

The registry is a query over the ``checkpoints`` table (one row per digest the agents published), through
the same read-only path as ``vigil sql``. Lineage is found by digest: a load whose root digest equals a
save's was loaded from that save (from another run: the run resumed from it). A load that failed its
manifest has another digest by definition, so it is matched to the last save of the same path instead.
"""

from __future__ import annotations

import argparse

from trainvigil.daemon.cli._answer import add_query_flags, answer

_SAVES_OF = "SELECT s.run_id || ' step ' || coalesce(s.step::VARCHAR, '?') FROM checkpoints s WHERE s.origin = 'save'"

REGISTRY_SQL = f"""
SELECT c.time, c.run_id, c.rank, c.origin, c.step, c.path, c.algo, left(c.root, 16) AS root,
  CASE c.origin
    WHEN 'save' THEN
      (SELECT count(*) FROM checkpoints l WHERE l.origin = 'load' AND l.root = c.root AND l.ok IS NOT FALSE)
      || ' loads ok, '
      || (SELECT count(*) FROM checkpoints l
          WHERE l.origin = 'load' AND l.ok IS FALSE AND l.path = c.path AND l.time >= c.time
            AND NOT EXISTS (SELECT 1 FROM checkpoints n WHERE n.origin = 'save' AND n.path = c.path
                            AND n.time > c.time AND n.time <= l.time)) || ' failed'
    WHEN 'load' THEN CASE WHEN c.ok IS FALSE THEN 'FAILED: differs from its manifest' ELSE 'ok' END
  END AS verified,
  CASE c.origin
    WHEN 'save' THEN
      (SELECT 'resumed by ' || string_agg(DISTINCT l.run_id, ', ' ORDER BY l.run_id) FROM checkpoints l
       WHERE l.origin = 'load' AND l.root = c.root AND l.run_id <> c.run_id)
    WHEN 'load' THEN
      coalesce(
        ({_SAVES_OF} AND s.root = c.root ORDER BY s.time DESC LIMIT 1),
        ({_SAVES_OF} AND c.ok IS FALSE AND s.path = c.path AND s.time <= c.time ORDER BY s.time DESC LIMIT 1)
      )
  END AS lineage
FROM checkpoints c
WHERE c.origin IN ('save', 'load'){{where}}
ORDER BY c.time, c.run_id, c.rank
"""
"""``{where}``: an extra condition on ``c`` (a run), or nothing."""

WRITER_SQL = """
SELECT run_id, rank, step, time, path FROM checkpoints
WHERE origin = 'save' AND root = {root} ORDER BY time DESC LIMIT 5
"""


def quoted(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def registry_sql(run_id: str | None) -> str:
    """The query behind ``vigil checkpoints [RUN]``."""
    return REGISTRY_SQL.format(where="" if run_id is None else f" AND c.run_id = {quoted(run_id)}")


def writer_sql(root: str) -> str:
    """The saves whose root digest is ``root``, newest first: who wrote a file with that content."""
    return WRITER_SQL.format(root=quoted(root))


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    checkpoints = sub.add_parser(
        "checkpoints",
        help="every checkpoint saved or loaded, its verification and lineage",
        description="The checkpoint registry: every checkpoint the daemon has seen saved or loaded "
        "(trainvigil.checkpoint.save/load), oldest first, with its digest, what its loads proved (a load "
        "verified against the manifest, or FAILED) and its lineage (the save a load came from, found by "
        "digest; the runs that resumed from a save).",
    )
    checkpoints.add_argument("run", nargs="?", help="only this run's checkpoints")
    add_query_flags(checkpoints)
    checkpoints.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    return answer(args, registry_sql(args.run))
