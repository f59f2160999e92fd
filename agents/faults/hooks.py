"""The armed faults applied to real training: gradient hooks, optimizer-step hooks, the checkpoint file.

Installed only when ``VIGIL_FAULT`` armed a plan (:mod:`.plan`); without one ``watch()`` and
``checkpoint.save`` install and run nothing of this. Where each fault goes:

* ``nan_grad`` / ``grad_spike``: a hook on the parameters' gradients, run as backward produces them,
  so the fault is there before your ``clip_grad_norm_`` and in what you log, as a real one would be
  (one element of the first parameter's gradient becomes NaN; every gradient x1000, one step);
* ``lr_spike``: every group's ``lr`` x100 for each optimizer step from K, put back after it, so an LR
  scheduler keeps computing from its own values;
* ``slowdown``: before each optimizer step from K, a sleep of half the step's measured time (1.5x);
  ``straggler`` is the same slowdown, armed by the ``two_rank`` canary in one rank only;
* ``stall``: the training thread blocks before optimizer step K until the agent closes;
* ``gil``: ``GIL_THREADS`` pure-Python busy threads start at step K and run until the agent closes (a
  queue for the GIL, as busy tokenizer or logging threads make; one thread alone barely queues);
* ``ckpt_corrupt``: a bit flipped in the file the first ``checkpoint.save(step=S >= K)`` wrote.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from .plan import FaultPlan

GRAD_FACTOR = 1000.0
LR_FACTOR = 100.0
SLOWDOWN = 1.5
GIL_THREADS = 3
"""One busy thread makes the training thread wait about one switch interval for the GIL, which
``gil_contention`` rightly leaves alone (held < 0.7 or no queue, on a quiet or a loaded machine); three make a queue."""


class TrainingFaults:
    """A plan's training faults on one watched optimizer; ``watch()`` numbers the steps (``step()``)."""

    def __init__(
        self,
        plan: FaultPlan,
        optimizer: Any,
        params: list[Any],
        names: list[str],
        step: Callable[[], int],
        sync: Callable[[], None] | None = None,
    ) -> None:
        self.plan = plan
        self.optimizer = optimizer
        self._params = params
        self._names = names
        self._step = step
        self._sync = sync  # makes a step's measured time the device's (slowdown on an accelerator)
        self._nan, self._spike = plan.get("nan_grad"), plan.get("grad_spike")
        self._lr = plan.get("lr_spike")
        self._slow = tuple(f for f in (plan.get("slowdown"), plan.get("straggler")) if f is not None)
        self._gil, self._stall = plan.get("gil"), plan.get("stall")
        self._spike_step: int | None = None
        self._saved_lr: list[Any] | None = None
        self._resumed: float | None = None

    def install(self) -> list[Any]:
        """Register the hooks (after ``watch()``'s own); returns their handles for ``remove()``."""
        handles = []
        trained = [(p, n) for p, n in zip(self._params, self._names, strict=True) if p.requires_grad]
        if self._nan is not None and trained:
            param, name = trained[0]
            handles.append(param.register_hook(lambda grad: self._nan_grad(grad, name)))
        if self._spike is not None:
            handles.extend(p.register_hook(self._grad_spike) for p, _ in trained)
        handles.append(self.optimizer.register_step_pre_hook(self._before_step))
        if self._lr is not None:
            handles.append(self.optimizer.register_step_post_hook(self._after_step))
        return handles

    # ---- gradients (as backward produces them) ----------------------------------------------

    def _nan_grad(self, grad: Any, name: str) -> Any:
        fault, step = self._nan, self._step()
        if fault is None or grad.is_sparse or not self.plan.due(fault, step):
            return None
        grad = grad.clone()
        grad[(0,) * grad.dim()] = float("nan")
        self.plan.fired(fault, step, param=name)
        return grad

    def _grad_spike(self, grad: Any) -> Any:
        step = self._step()
        if self._spike is not None and self.plan.due(self._spike, step):
            self._spike_step = step
            self.plan.fired(self._spike, step, factor=GRAD_FACTOR)
        return grad * GRAD_FACTOR if step == self._spike_step else None

    # ---- the optimizer step ------------------------------------------------------------------

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        plan, step = self.plan, self._step()
        plan.last_step = step
        if self._lr is not None and step >= self._lr.step:
            if plan.due(self._lr, step):
                plan.fired(self._lr, step, factor=LR_FACTOR)
            self._saved_lr = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * LR_FACTOR
        if self._slow:
            self._slow_down(step)
        if self._gil is not None and plan.due(self._gil, step):
            names = [f"trainvigil-fault-gil-{i}" for i in range(GIL_THREADS)]
            for name in names:
                threading.Thread(target=_burn, args=(plan.released,), name=name, daemon=True).start()
            plan.fired(self._gil, step, threads=names)
        if self._stall is not None and plan.due(self._stall, step):
            plan.fired(self._stall, step)
            plan.released.wait()  # until the agent closes (another thread) or the process is killed

    def _slow_down(self, step: int) -> None:
        """Sleep (SLOWDOWN - 1) times the work since the last step resumed: each step takes SLOWDOWN times as long."""
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        started = [f for f in self._slow if step >= f.step]
        if started and self._resumed is not None:
            for fault in started:
                if self.plan.due(fault, step):
                    self.plan.fired(fault, step, factor=SLOWDOWN)
            time.sleep((SLOWDOWN - 1.0) * (now - self._resumed))
        self._resumed = time.perf_counter()

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        saved, self._saved_lr = self._saved_lr, None
        if saved is not None:
            for group, lr in zip(optimizer.param_groups, saved, strict=True):
                group["lr"] = lr


def _burn(stop: threading.Event) -> None:
    """Pure-Python arithmetic: holds the GIL (nothing here releases it) until ``stop`` is set."""
    n = 0
    while not stop.is_set():
        for i in range(10_000):
            n += i


def corrupt_saved(plan: FaultPlan, path: str | os.PathLike[str], step: int | None) -> None:
    """``ckpt_corrupt``: flip a bit of the checkpoint ``checkpoint.save`` just wrote at ``step``, if due."""
    fault = plan.get("ckpt_corrupt")
    if fault is None or not plan.due(fault, step):
        return
    target = Path(path)
    with target.open("r+b") as f:
        offset = _tensor_byte(f, target.stat().st_size)
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))
        f.flush()
        os.fsync(f.fileno())
    plan.fired(fault, step, path=str(target.resolve()), offset=offset)


def _tensor_byte(f: BinaryIO, size: int) -> int:
    """The middle byte of the first tensor in a ``torch.save`` zip: tensors are stored uncompressed
    and torch does not check the zip's CRCs, so the file still loads and only the digest differs.
    Another format: the file's middle byte."""
    try:
        with zipfile.ZipFile(f) as archive:
            info = next(
                i
                for i in archive.infolist()
                if "/data/" in i.filename and i.file_size > 0 and i.compress_type == zipfile.ZIP_STORED
            )
    except (zipfile.BadZipFile, StopIteration):
        return size // 2
    f.seek(info.header_offset + 26)  # the local header's name and extra-field lengths
    name_len, extra_len = struct.unpack("<HH", f.read(4))
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2
