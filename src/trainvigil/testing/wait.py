"""Waiting on a condition with a deadline, never a bare ``sleep``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that.

    Raises:
        TimeoutError: ``timeout`` seconds passed; the message names ``what`` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
