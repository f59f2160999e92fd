"""The daemon's heap tuning takes on this platform (glibc): big buffers are mmapped and returned."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from trainvigil.daemon.malloc import tune


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's M_MMAP_THRESHOLD is glibc's")
def test_tune_takes_on_glibc_and_freed_big_buffers_leave_the_process() -> None:
    # In a fresh process, so this test process's own heap is not changed.
    code = (
        "import numpy as np, resource, sys\n"
        "from trainvigil.daemon.malloc import tune\n"
        "assert tune()\n"
        "def rss(): return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize()\n"
        "base = rss()\n"
        # A freed 4 MiB buffer raises glibc's dynamic threshold; after it, smaller big buffers would be heap.
        "big = np.ones(4 << 20, dtype=np.uint8); del big\n"
        "held = [np.ones(1 << 20, dtype=np.uint8) for _ in range(64)]\n"
        "keep = held[::16]; del held\n"  # free 60 of 64 MiB, the kept ones spread across it
        "sys.stdout.write(str((rss() - base) >> 20))\n"
    )
    grown = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grown < 16, f"{grown} MiB still resident after freeing 60 of 64 MiB of 1 MiB buffers"


def test_tune_never_raises() -> None:
    assert tune() in (True, False)


def test_tune_gc_collects_rarely_and_freezes_nothing() -> None:
    code = (
        "import gc\n"
        "from trainvigil.daemon.malloc import GC_THRESHOLDS, tune_gc\n"
        "tune_gc()\n"
        "print(gc.get_threshold() == GC_THRESHOLDS, gc.get_freeze_count() == 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_hands_freed_small_blocks_back() -> None:
    code = (
        "import resource, sys\n"
        "from trainvigil.daemon.malloc import trim, tune\n"
        "tune()\n"
        "def rss(): return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize()\n"
        "base = rss()\n"
        "blocks = [bytes(4000) for _ in range(50_000)]\n"  # ~200 MiB of blocks below the mmap threshold
        "keep = blocks[::1000]; del blocks\n"  # the kept ones pin the arena's top: free() alone keeps it
        "before = rss()\n"
        "assert trim()\n"
        "sys.stdout.write(f'{(before - base) >> 20} {(rss() - base) >> 20}')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    held, trimmed = map(int, out.split())
    assert trimmed < held / 2, f"{held} MiB held after free, {trimmed} MiB after trim"
