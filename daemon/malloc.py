"""The daemon's C heap: large transient buffers go back to the system once freed.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` bytes with a mapping of its own,
unmapped again on ``free``. The threshold starts at 128 KiB but moves: each freed mapping
raises it to that size (up to 32 MiB), and from then on the daemon's big transient buffers
(message payloads, decoded columns, a batch's Arrow tables: 0.1-16 MiB each) come from the
heap arenas, where freed memory mostly stays with the process. With the threshold fixed at
128 KiB they stay mapped and go back on ``free``. The effect on a 60 s flood (``bench/flood.py``,
quiet machine) is modest: peak RSS 687 -> 651-655 MiB; most of the peak is live data. Two arenas
serve the daemon's few threads (event loop, writer, detectors) instead of eight per core.

Off glibc (musl, macOS) ``mallopt`` is missing or does nothing, and so does :func:`tune`. Small
freed blocks stay in the arenas; :func:`trim` (``malloc_trim``) hands their free pages back, which the
ingest does each time it catches up after work: ~300 -> ~200 MiB after a flood.

Python's cycle collector is tuned here too (:func:`tune_gc`). The daemon holds many long-lived
objects (each stream's detector state) and decodes thousands of short-lived ones per batch; with
the default thresholds (700, 10, 10) a young collection runs every 700 allocations and an old one
walks all of that state every hundred. Almost nothing the daemon makes is cyclic (reference
counts free it), so collecting rarely costs little memory and saves time: on a fleet backlog of
4-step messages (``bench/ingest.py --fleet``'s) the drain went from ~4 100 to ~4 600 messages/s.
"""

from __future__ import annotations

import ctypes
import gc

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 128 * 1024


def trim() -> bool:
    """Give the free pages of every malloc arena back to the system; False off glibc. Milliseconds
    on a heap of hundreds of MiB, without the GIL (ctypes releases it)."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim(0)
    return True


def tune() -> bool:
    """Fix glibc's mmap threshold and arena count for this process; True when both took."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_ARENA_MAX, 2) == 1


GC_THRESHOLDS = (100_000, 50, 100)
"""Allocations before a young collection, and young (then middle) collections before an older one."""


def tune_gc() -> None:
    """Collect cycles rarely. Nothing is frozen (``gc.freeze``): frozen objects are never collected, not even
    at exit, and DuckDB's bindings then report them as leaks after the daemon's last line."""
    gc.set_threshold(*GC_THRESHOLDS)
