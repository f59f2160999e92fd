"""The web view's connection cap (``daemon/web/connections.py``) against the process's descriptor limit."""

from __future__ import annotations


def test_the_connection_cap_leaves_half_the_descriptors_and_the_accept_burst_fits_beside_it() -> None:
    from trainvigil.daemon.web.connections import MAX_CONNECTIONS, accept_backlog, connection_cap

    assert connection_cap(1024) == 512 and connection_cap(1_048_576) == MAX_CONNECTIONS
    for limit in (1024, 4096, 65536):
        cap = connection_cap(limit)
        assert cap + 2 * accept_backlog(cap) < limit - 64, limit
