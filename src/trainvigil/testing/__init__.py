"""Test a deployment against the real thing: a nats-server cluster on loopback, the daemon's metrics, deadlines.

What trainvigil's own tests and benchmarks use, for yours (it needs the daemon extra)::

    from trainvigil.testing import NatsCluster, steps_committed, wait_until

    with NatsCluster(tmp_path, nodes=3, shards=1) as cluster:  # three real nats-server processes
        ...  # start vigil up --nats cluster.url, train, then:
        wait_until(lambda: steps_committed(http_port) >= 100, 30, "100 steps stored")

Nothing in the product imports this package.
"""

from __future__ import annotations

from .cluster import NatsCluster
from .probes import STEPS_SERIES, memory_mib, scrape, steps_committed
from .wait import wait_until

__all__ = ["STEPS_SERIES", "NatsCluster", "memory_mib", "scrape", "steps_committed", "wait_until"]
