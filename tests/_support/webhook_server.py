"""A real local HTTP server that plays a webhook endpoint: answers with planned statuses, or hangs."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

HANG = 0
"""A planned status of 0: read the request, then answer nothing until the server closes."""


class HookServer:
    """Records every POST; the n-th request gets ``plan[n]`` (the last entry repeats)."""

    def __init__(self, plan: list[int]) -> None:
        self.plan = plan
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.bodies: list[bytes] = []
        """Each request's body as sent (what a signature covers)."""
        self.paths: list[str] = []
        self.location = ""
        """Sent as ``Location`` with a 3xx answer."""
        self.release = threading.Event()
        self._lock = threading.Lock()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with hook._lock:
                    status = hook.plan[min(len(hook.requests), len(hook.plan) - 1)]
                    hook.requests.append(json.loads(body))
                    hook.headers.append(dict(self.headers))
                    hook.bodies.append(body)
                    hook.paths.append(self.path)
                if status == HANG:
                    hook.release.wait(120)
                    return
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", hook.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the test asserts on what arrived instead."""

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/secret-token"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


@contextmanager
def hook_server(*plan: int) -> Iterator[HookServer]:
    """A running :class:`HookServer` answering ``plan`` (default: always 200)."""
    server = HookServer(list(plan) or [200])
    server.start()
    try:
        yield server
    finally:
        server.close()
