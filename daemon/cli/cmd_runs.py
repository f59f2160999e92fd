"""``vigil runs``: every run with its status, step counts, last step and last seen."""

from __future__ import annotations

import argparse

from trainvigil.daemon.cli._answer import add_query_flags, answer

RUNS_SQL = """
SELECT r.run_id,
       CASE WHEN r.status = 'running' AND EXISTS (
                SELECT 1 FROM anomalies a WHERE a.run_id = r.run_id AND a.detector = 'run_failed'
                AND a.value IS NOT NULL AND a.state <> 'cleared')
            THEN 'lost' ELSE r.status END AS status,
       r.world_size,
       count(s.step) AS steps, max(s.step) AS last_step, r.last_seen,
       (SELECT coalesce(sum(d.count), 0) FROM data_loss d
        WHERE d.time >= r.first_seen AND d.time - INTERVAL 7 DAY <= coalesce(r.ended_at, r.last_seen))
           AS maybe_lost
FROM runs r LEFT JOIN steps s USING (run_id)
GROUP BY ALL ORDER BY r.last_seen DESC
"""
"""``status``: ``lost`` for a running run with an open ``run_failed`` page for a rank that vanished
(that page's ``value`` is the silence in seconds). ``maybe_lost``: stream messages recorded lost
(``data_loss``) while the run may have been
publishing: a lost message is at most ``stream.max_age_s`` (7 days by default) older than the
moment its loss was found, and which run it belonged to is unknowable."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runs = sub.add_parser(
        "runs",
        help="list runs with step counts, last step and last seen",
        description="List runs with step counts, last step and last seen.",
    )
    add_query_flags(runs)
    runs.set_defaults(command_run=run)


def run(args: argparse.Namespace) -> int:
    return answer(args, RUNS_SQL)
