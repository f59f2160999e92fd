"""One nats-server per test worker, shared by its tests, each test in a namespace of its own.

A namespace (the docs' namespaces guide) gives a test what a broker of its own gave it: its agents, daemons and
commands, all told ``VIGIL_NAMESPACE``, publish, store and ask on subjects and a stream no other namespace's
client ever matches. What a broker of its own also gave, an empty broker, comes from the clean-up after each
test (:meth:`NamespacedServer.clean`): its streams are deleted, so a worker's broker does not gather hundreds
of streams and their files, and nothing it made may still be subscribed.

A worker runs one test at a time, so whatever is on the broker when a test ends is that test's.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import urllib.request
from typing import Any

import nats
from support import NatsServer, wait_for

from trainvigil.schemas.subjects import DEFAULT_SUBJECTS, STREAM, Subjects

LEFT_SUBSCRIBED_S = 15.0
"""How long the clean-up waits for the test's connections to close (a killed process's, a daemon unwinding)."""

_numbers = itertools.count()
_PRIVATE = (
    "the worker's nats-server is shared by its tests and cannot be {what} by one: take the private_nats_server "
    "fixture instead of nats_server"
)


def fresh_namespace(test_name: str) -> str:
    """A namespace no other test of this worker had: a number, then as much of ``test_name`` as fits."""
    slug = re.sub(r"[^A-Za-z0-9_-]", "_", test_name.removeprefix("test_"))
    return f"t{next(_numbers)}-{slug}"[:32]


class NamespacedServer(NatsServer):
    """The worker's broker as one test sees it: its :attr:`url` and :attr:`port`, and :attr:`subjects`, those of
    the test's namespace.

    Other tests use the broker after this one, so it cannot be stopped or started, and its process is not the
    test's (:attr:`process` is ``None``): a test that needs either takes ``private_nats_server``.
    """

    def __init__(self, shared: NatsServer, namespace: str) -> None:
        assert shared.monitor_port is not None, "the shared broker serves monitoring: the clean-up reads it"
        self.port, self.url, self.store_dir, self.config_file = shared.port, shared.url, shared.store_dir, None
        self.monitor_port = shared.monitor_port
        self.process = None
        self.subjects = Subjects(namespace)

    def start(self) -> None:
        raise AssertionError(_PRIVATE.format(what="started"))

    def stop(self) -> None:
        raise AssertionError(_PRIVATE.format(what="stopped"))

    def clean(self) -> None:
        """After the test: delete every stream on the broker, then wait for every connection with a subscription
        to go.

        Raises:
            AssertionError: the test made a stream of the default namespace (its subjects or name; it is deleted
                too), or something is still subscribed after :data:`LEFT_SUBSCRIBED_S`.
        """
        deleted = asyncio.run(self._delete_streams())
        default = [name for name, subjects in deleted.items() if _of_default_namespace(name, subjects)]
        try:
            wait_for(lambda: not self._subscribed(), LEFT_SUBSCRIBED_S, "the test's subscriptions to go")
        except TimeoutError:
            left = self._subscribed()
            raise AssertionError(f"still subscribed on the shared broker after the test: {left}") from None
        assert not default, (
            f"streams {default} of the default namespace were made on the shared broker: name the subjects of the "
            f"test's namespace ({self.subjects.namespace!r}, VIGIL_NAMESPACE) or take private_nats_server"
        )

    async def _delete_streams(self) -> dict[str, list[str]]:
        """Every stream's name and subjects, once deleted."""
        nc = await nats.connect(self.url, connect_timeout=5)
        try:
            js = nc.jetstream()
            found = {info.config.name or "": list(info.config.subjects or []) for info in await js.streams_info()}
            for name in found:
                await js.delete_stream(name)
            return found
        finally:
            await nc.close()

    def _subscribed(self) -> dict[str, list[str]]:
        """Each connection that holds subscriptions (by its name, else its client id): their subjects."""
        url = f"http://127.0.0.1:{self.monitor_port}/connz?subs=1&limit=100000"
        with urllib.request.urlopen(url, timeout=5) as answer:
            connz: dict[str, Any] = json.load(answer)
        return {
            str(c.get("name") or c["cid"]): list(c["subscriptions_list"])
            for c in connz.get("connections") or []
            if c.get("subscriptions_list")
        }


def _of_default_namespace(name: str, subjects: list[str]) -> bool:
    default = f"{DEFAULT_SUBJECTS.prefix}."
    return name == STREAM or name.startswith(f"{STREAM}-") or any(s.startswith(default) for s in subjects)
