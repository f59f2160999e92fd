"""The daemon's C heap: large transient buffers go back to the system once freed.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` bytes with a mapping of its own,
unmapped again on ``free``. The threshold starts at 128 KiB but moves: each freed mapping
raises it to that size (up to 32 MiB), and from then on the daemon's big transient buffers
(message payloads, decoded columns, a batch's Arrow tables: 0.1-16 MiB each) come from the
heap arenas, where freed memory mostly stays with the process. With the threshold fixed at
128 KiB they stay mapped and go back on ``free``. The effect on a 60 s flood (``bench/flood.py``,
quiet machine) is modest: peak RSS 687 -> 651-655 MiB; most of the peak is live data. Two arenas
serve the daemon's few threads (event loop, writer, detectors) instead of eight per core.

Off glibc (musl, macOS) ``mallopt`` is missing or does nothing, and so does :func:`tune`.
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 128 * 1024


def tune() -> bool:
    """Fix glibc's mmap threshold and arena count for this process; True when both took."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_ARENA_MAX, 2) == 1
