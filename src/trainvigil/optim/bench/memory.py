"""Peak memory over a span of training steps, read where the run's tensors live.

On a CUDA device it is the caching allocator's own high-water mark (``torch.cuda.max_memory_allocated``,
reset at the start): every tensor of the step, optimizer state and temporaries included. On the CPU
it is tracemalloc's, when the caller started it (it is never started or stopped here: doing so while
other threads run crashes CPython before 3.12.9, gh-128679). tracemalloc sees what Python's
allocators hand out, not the storage of torch's CPU tensors (c10 allocates those itself), so on the
CPU the tensors' share is in the run's ``state_bytes`` and the peak is the step's Python overhead.
"""

from __future__ import annotations

import tracemalloc

import torch


class PeakMeter:
    """``start()`` at the span's first step, ``read()`` at its end: the peak above the level at ``start()``.

    Args:
        device: where the run's parameters are; ``read()`` is ``None`` on the CPU when tracemalloc is off.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self._before = 0

    def start(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before = torch.cuda.memory_allocated(self.device)
        elif tracemalloc.is_tracing():
            tracemalloc.reset_peak()
            self._before = tracemalloc.get_traced_memory()[0]

    def read(self) -> int | None:
        if self._cuda:
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self._before
        if tracemalloc.is_tracing():
            return tracemalloc.get_traced_memory()[1] - self._before
        return None
