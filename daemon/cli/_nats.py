"""nats-py loaded for a command's broker URL: without aiohttp when no node is a websocket one.

nats-py imports aiohttp with its client only for its websocket transport (``ws://``, ``wss://``), and declares it
an optional extra (``nats-py[aiohttp]``): where aiohttp is not installed it loads without it, and only a websocket
URL then fails. aiohttp takes about as long to import as the rest of nats-py, so a command that dials plain NATS
loads nats-py as if aiohttp were not installed. Nothing of nats-py is changed; the process's own ``import aiohttp``
works as before afterwards.

Only the first load in a process decides, and a command dials one URL (or a list of one kind) for its life. Should
a nats-py need aiohttp to import at all, it is imported the ordinary way.
"""

from __future__ import annotations

import sys

from trainvigil.schemas.natsurl import NatsUrl

_WEBSOCKET_ONLY = "aiohttp"


def load_for(url: NatsUrl) -> None:
    """Import nats-py's client for connecting to ``url`` (a no-op once it is loaded)."""
    if url.websocket or "nats.aio.client" in sys.modules or _WEBSOCKET_ONLY in sys.modules:
        return
    sys.modules[_WEBSOCKET_ONLY] = None  # type: ignore[assignment]  # import raises ImportError, as if not installed
    try:
        import nats.aio.client  # noqa: F401
    except ImportError:
        pass  # this nats-py needs aiohttp after all: it is imported with it at the connect
    finally:
        del sys.modules[_WEBSOCKET_ONLY]
