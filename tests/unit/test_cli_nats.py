"""``daemon/cli/_nats.py``: a command that dials plain NATS loads nats-py without aiohttp, one that dials a
websocket URL with it, and the process's own ``import aiohttp`` works either way."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("url", "websocket"), [("nats://127.0.0.1:4222", False), ("h1:1,h2:2", False), ("wss://h1:443", True)]
)
def test_nats_py_loads_aiohttp_only_for_a_websocket_url(url: str, websocket: bool) -> None:
    _run(
        "import sys\n"
        "from trainvigil.daemon.cli._nats import load_for\n"
        "from trainvigil.schemas.natsurl import parse_nats_url\n"
        f"load_for(parse_nats_url({url!r}))\n"
        "import nats.aio.transport as transport\n"
        f"assert (transport.aiohttp is not None) is {websocket}, transport.aiohttp\n"
        f"assert ('aiohttp' in sys.modules) is {websocket}, 'aiohttp loaded for a plain URL'\n"
        "import aiohttp\n"  # what nats-py loaded without stays importable by anyone else
        "assert aiohttp.ClientSession\n"
    )


def test_a_process_that_loaded_nats_py_already_keeps_it_as_it_is() -> None:
    """Only the first load decides: nats-py imported with aiohttp before is left alone (a test process, say)."""
    _run(
        "import nats.aio.transport as transport\n"
        "from trainvigil.daemon.cli._nats import load_for\n"
        "from trainvigil.schemas.natsurl import parse_nats_url\n"
        "load_for(parse_nats_url('nats://127.0.0.1:4222'))\n"
        "assert transport.aiohttp is not None\n"
    )
