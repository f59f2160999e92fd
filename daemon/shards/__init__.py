"""Queries across shards, as pure logic: one query split into what every shard runs and the merge over
their answers (:mod:`.planner`). Asking the shards is the caller's (``vigil sql``:
:mod:`trainvigil.daemon.cli.shardsql`)."""

from trainvigil.daemon.shards.planner import PARTIALS, ShardPlan, plan

__all__ = ["PARTIALS", "ShardPlan", "plan"]
