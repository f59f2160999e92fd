"""An uncaught exception is what the run ended with: chained ``sys.excepthook`` and
``threading.excepthook``, never swallowing the user's own hooks.

The main thread's uncaught exception marks every live agent of the process, so the ``run_end``
it sends at interpreter exit says ``status = "error"`` with the exception's type and message
(the daemon's ``run_failed`` pages on it). An exception that ends another thread does not end
the run: it becomes a ``thread_exception`` event. Whatever hook was installed before (the
default, an IDE's, a framework's) runs after ours, unchanged.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Protocol

from trainvigil.schemas.limits import MAX_TEXT

_installed = False


class Crashable(Protocol):
    def crashed(self, error: str) -> None: ...

    def event(self, kind: str, /, step: int | None = None, **fields: Any) -> None: ...


def describe(exc_type: type[BaseException], exc: BaseException | None) -> str:
    """``Type: message``, bounded for the wire."""
    text = f"{exc_type.__name__}: {exc}" if exc is not None and str(exc) else exc_type.__name__
    return text[: MAX_TEXT // 16]


def install(agents: Callable[[], Iterable[Crashable]]) -> None:
    """Chain the process's exception hooks once; ``agents()`` says which agents are live."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.excepthook
    previous_thread = threading.excepthook

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(exc_type, KeyboardInterrupt):  # ctrl-c is the user stopping, not a crash
            for agent in agents():
                agent.crashed(describe(exc_type, exc))
        previous(exc_type, exc, tb)

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit:
            name = args.thread.name if args.thread is not None else "?"
            for agent in agents():
                agent.event("thread_exception", thread=name, error=describe(args.exc_type, args.exc_value))
        previous_thread(args)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
