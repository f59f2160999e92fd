"""Replica parity for ``watch(..., parity_every=N)``: parameter digests hashed off the training thread.

At a parity step the parameters are copied to host memory (non-blocking from a device, a
memory copy on CPU) and queued; one background thread hashes each copy and publishes a
``CheckpointDigest`` with origin ``parity``. At most :data:`MAX_IN_FLIGHT` copies wait;
beyond that a parity step is skipped and counted rather than holding more memory.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import torch

from trainvigil.schemas import CheckpointDigest

from ._host_copy import to_host
from .digest import digest

log = logging.getLogger("trainvigil.torch")

MAX_IN_FLIGHT = 2
"""Parameter copies waiting to be hashed at most; beyond, a parity step is skipped (counted)."""


class Parity:
    """Copies parameters at parity steps; a background thread digests and publishes them."""

    def __init__(self, agent: Any, names: list[str], params: list[torch.Tensor], algo: str = "blake3") -> None:
        self.agent = agent
        self.names = names
        self.params = params
        self.algo = algo
        self.cuda = any(p.is_cuda for p in params)
        self.skipped = 0
        """Parity steps skipped because earlier copies were still being hashed."""
        self._queue: queue.SimpleQueue[tuple[int, dict[str, torch.Tensor], Any] | None] = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._outstanding = 0
        self._thread: threading.Thread | None = None

    def take(self, step: int) -> None:
        """Copy the parameters as they are after optimizer step ``step`` (training thread)."""
        with self._cv:
            if self._outstanding >= MAX_IN_FLIGHT:
                self.skipped += 1
                return
            self._outstanding += 1
        snapshot = {name: to_host(p) for name, p in zip(self.names, self.params, strict=True)}
        done = None
        if self.cuda:
            done = torch.cuda.Event()
            done.record()
        self._queue.put((step, snapshot, done))
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="trainvigil-parity", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            step, snapshot, done = item
            try:
                if done is not None:
                    done.synchronize()
                d = digest(snapshot, self.algo, threads=1)  # one thread: training keeps the other cores
                self.agent.publish(
                    CheckpointDigest(
                        time=time.time(), step=step, algo=d.algo, root=d.root, tensors=d.entries, origin="parity"
                    )
                )
            except Exception:
                log.exception("trainvigil: parity digest at step %d failed", step)
            finally:
                del snapshot
                with self._cv:
                    self._outstanding -= 1
                    self._cv.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait until every queued copy is published; ``False`` at the deadline."""
        with self._cv:
            return self._cv.wait_for(lambda: self._outstanding == 0, timeout)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)  # the thread ends after the copies queued before
            self._thread = None
