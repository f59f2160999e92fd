"""The ``Host`` names the web view answers (``daemon/web/hosts.py``): its own addresses and names, and those allowed."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("bind", "host", "answered"),
    [
        ("127.0.0.1", "127.0.0.1:9464", True),
        ("127.0.0.1", "localhost", True),
        ("127.0.0.1", "[::1]:9464", True),
        ("127.0.0.1", "127.0.0.2", True),
        ("127.0.0.1", "localhost.", True),
        ("127.0.0.1", "10.0.0.1", False),
        ("127.0.0.1", "attacker.example:9464", False),
        ("127.0.0.1", "127.0.0.1.nip.io", False),
        ("127.0.0.1", "", False),
        ("10.0.0.5", "10.0.0.5:9464", True),
        ("10.0.0.5", "10.0.0.6", False),
        ("0.0.0.0", "192.168.1.20", True),
        ("::", "[fe80::1]", True),
        ("0.0.0.0", "attacker.example", False),
        ("vigil.internal", "vigil.internal:9464", True),
        ("vigil.internal", "VIGIL.internal.", True),
    ],
)
def test_a_host_is_answered_when_it_names_an_address_or_name_the_daemon_listens_on(
    bind: str, host: str, answered: bool
) -> None:
    from trainvigil.daemon.web.hosts import HostPolicy

    assert HostPolicy(bind).allows(host) is answered


def test_allowed_hosts_add_names_subdomains_or_every_name() -> None:
    from trainvigil.daemon.web.hosts import HostPolicy

    policy = HostPolicy("127.0.0.1", ["daemon", ".vigil.example", " "])
    assert [policy.allows(h) for h in ("daemon:9464", "vigil.example", "a.b.vigil.example")] == [True] * 3
    assert not any(policy.allows(h) for h in ("daemon.attacker.example", "xvigil.example", "vigil.example.evil"))
    assert HostPolicy("127.0.0.1", ["*"]).allows("anything.example")
