"""Opt-in (``flush_on_sigterm``): ``SIGTERM`` ends the process like an exit, so its agents flush first.

A scheduler stops a job with ``SIGTERM`` (preemption, ``scancel``, ``kubectl delete``, torchrun's
elastic agent) and ``SIGKILL`` some seconds later. By default ``SIGTERM`` kills at once, with no
exit, and the agent's last second of steps and the messages waiting for their acks go with it.

With this on, a Python handler marks every live agent (``run_end`` says ``status = "error"``,
``error`` starting with ``SIGTERM``) and raises ``SystemExit(143)``: the interpreter's exit closes the agents
within ``close_timeout``. A Python handler only runs once the main thread is back in Python, so a
rank stuck in C code (a collective whose peer is gone) would no longer die of ``SIGTERM``. A
watcher thread covers that: CPython's C-level handler writes the signal's number to the wakeup
fd (:func:`signal.set_wakeup_fd`) at once, whatever the main thread does; when the Python
handler has not run :data:`STUCK_AFTER_S` later, the watcher closes the agents itself (for up to
:data:`CLOSE_WITHIN_S`) and ends the process with ``os._exit(143)``. Once the Python handler has run,
the exit is the interpreter's, with the script's own ``atexit`` work, and the watcher stays out of it;
so it does when a handler set after ours owns ``SIGTERM`` (a framework's: what it does is its business).

Installed only from the main thread, and only while ``SIGTERM`` has its default action (a
framework's or the script's own handler is left alone). When another wakeup fd is set already
(an asyncio loop with signal handlers), the handler is installed without the watcher. A forked
child (a DataLoader worker) gets the default action and no wakeup fd back.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Protocol

log = logging.getLogger("trainvigil.agent")

STUCK_AFTER_S = 5.0
"""How long the watcher waits for the main thread to run the Python handler before it takes over."""
CLOSE_WITHIN_S = 15.0
"""How long the watcher lets the agents close (their ``close_timeout``, 10 s by default) before it exits anyway."""
EXIT_CODE = 128 + signal.SIGTERM
ERROR = "SIGTERM: the process was told to stop (preemption, scancel, kubectl delete, an elastic agent)"
"""What ``run_end`` says the run ended with."""


class Terminable(Protocol):
    def crashed(self, error: str) -> None: ...

    def close(self, timeout: float | None = None, *, status: str = "ok") -> bool: ...


_installed = False
_handled = threading.Event()  # the Python handler ran: the main thread is exiting through Python
_pipe: tuple[int, int] | None = None  # the wakeup fd's pipe (read, write), while the watcher has one


def install(agents: Callable[[], Iterable[Terminable]]) -> bool:
    """Handle ``SIGTERM`` as above, once per process; ``False`` when it cannot be (said in the log)."""
    global _installed, _pipe
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        log.warning("trainvigil: flush_on_sigterm needs trainvigil.init() on the main thread; SIGTERM is left alone")
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        log.info("trainvigil: flush_on_sigterm: SIGTERM has a handler already; it is left alone")
        return False

    def handler(signum: int, frame: FrameType | None) -> None:
        _handled.set()
        for agent in agents():
            agent.crashed(ERROR)
        raise SystemExit(EXIT_CODE)

    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter
        previous = -2
    if previous != -1:
        if previous >= 0:
            signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        log.info("trainvigil: flush_on_sigterm: another wakeup fd is set; a rank stuck in C code will wait for it")
    else:
        _pipe = (read, write)
        watch = (read, agents, handler)
        threading.Thread(target=_watch, args=watch, name="trainvigil-sigterm", daemon=True).start()
    signal.signal(signal.SIGTERM, handler)
    _installed = True
    return True


Handler = Callable[[int, FrameType | None], None]


def _watch(read: int, agents: Callable[[], Iterable[Terminable]], ours: Handler) -> None:
    """Wait for ``SIGTERM``'s byte; if the main thread has not handled it in time, close the agents and exit.
    Not when a handler set after ours owns ``SIGTERM`` now (Lightning's for SLURM saves a checkpoint and goes on)."""
    while True:
        try:
            data = os.read(read, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is ours:
            break
    if _handled.wait(STUCK_AFTER_S):
        return  # the main thread is exiting through Python: its exit closes the agents
    log.warning(
        "trainvigil: SIGTERM, and the main thread has not come back to Python in %.0f s (stuck in C code?): "
        "closing the agents from here, then exiting",
        STUCK_AFTER_S,
    )
    # On a thread of its own: a close hook that touches the device (watch()'s last step) could wait
    # behind the stuck collective; the process ends at the bound regardless.
    closer = threading.Thread(target=_close_all, args=(agents,), name="trainvigil-sigterm-close", daemon=True)
    closer.start()
    closer.join(CLOSE_WITHIN_S)
    os._exit(EXIT_CODE)


def _close_all(agents: Callable[[], Iterable[Terminable]]) -> None:
    for agent in list(agents()):
        try:
            agent.crashed(ERROR)
            agent.close(status="error")
        except Exception:
            log.exception("trainvigil: closing an agent on SIGTERM failed")


def _reset_in_child() -> None:
    """A forked child does not inherit any of it: its SIGTERM is its own, and the pipe is the parent's."""
    global _installed, _pipe
    if _installed:
        _installed = False
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _pipe is not None:
            signal.set_wakeup_fd(-1)
            for fd in _pipe:
                os.close(fd)
            _pipe = None


os.register_at_fork(after_in_child=_reset_in_child)
