"""Optimisation "keep_freed_memory": glibc's malloc keeps the memory a step frees, for the next step.

A CPU forward allocates its activations afresh for every operator, through the C library's
``malloc``. glibc serves a block of 32 MiB or more (and, until it has seen such blocks freed, far
smaller ones) with its own ``mmap`` and gives it back on ``free``; and it returns free memory at the
top of its heap to the system once more than the *trim threshold* lies there. A prefill step's
activations are several MiB each (8,192 tokens x 576 x 2 bytes is 9 MiB), so memory leaves the
process and comes back over and over, and each time the kernel zeroes every 4 KiB page again on its
first write (a page fault). The faults and the time they cost, with and without:
docs/perf-log.md#glibc-page-faults.

``keep_freed_memory`` raises both for this process: ``mmap`` only from 32 MiB (glibc's ceiling for
the setting) and trimming only past 2 GiB, so freed memory stays in the heap and is reused. The
process then holds on to its peak heap, as it would under tcmalloc or jemalloc (vLLM's CPU backend
preloads tcmalloc where it is installed). The setting is process-wide and stays once made. Where
the C library has no working ``mallopt`` (macOS, musl), it does nothing and returns False.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit systems (HEAP_MAX_SIZE / 2)
_TRIM_THRESHOLD = (1 << 31) - 1  # the largest int: trim only past 2 GiB free at the heap's top


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where there is no ``mallopt``."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    mallopt = getattr(ctypes.CDLL(libc_name), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
