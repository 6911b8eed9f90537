"""Keep the memory a training step frees inside the process, framework-free.

Every step allocates and frees the same large buffers (activations, gradients, the flat
copy sent to the allreduce). glibc's ``malloc`` hands large freed blocks back to the
kernel (``munmap``, or trimming the top of the heap), so the next step gets fresh pages
and takes a page fault for each 4 KiB it touches, every step (benchmarks/README.md,
has what that costs). PyTorch's CPU tensors and TensorFlow's both go through
``malloc``. :func:`keep_freed_memory` raises glibc's limits once per process, so freed
blocks stay in the heap and are reused; a process's memory then stays at its peak, as
it does with GPU caching allocators.

Blocks above 32 MiB, glibc's largest mmap threshold, are still mapped afresh for each
allocation by default. ``HVDTRAIN_KEEP_FREED_MEMORY=all`` takes those from the heap too
(no mmap at all), which makes steps with such buffers much faster and raises the peak
resident memory, since freed large blocks are kept and not always reused exactly
(benchmarks/README.md, "Large buffers"). Allocations of Horovod's background thread
above 64 MiB are mapped whatever the setting (glibc's other arenas).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

# glibc's mallopt parameters (malloc.h) and the values hvdtrain sets.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest: bigger blocks are always mapped
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024
TOP_PAD_BYTES = 64 * 1024 * 1024
# Set to 0 to leave the allocator as it is, to ALL to keep blocks above 32 MiB too.
SWITCH = "HVDTRAIN_KEEP_FREED_MEMORY"
ALL = "all"
# glibc's own variables for the same limits: a user who set one has chosen.
GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory(libc: Any = None) -> bool:
    """Make glibc's ``malloc`` keep freed blocks for reuse instead of returning them.

    Leaves the allocator alone when ``HVDTRAIN_KEEP_FREED_MEMORY=0``, when one of glibc's
    ``MALLOC_*_`` variables for these limits is set, or when the C library is not glibc.
    With ``HVDTRAIN_KEEP_FREED_MEMORY=all`` blocks above the largest mmap threshold come
    from the heap and are kept too.

    Args:
        libc: the C library to configure (default: this process's).

    Returns:
        Whether the limits were set.
    """
    switch = os.environ.get(SWITCH, "1").strip().lower()
    if switch not in ("0", "1", ALL):
        raise ValueError(f"{SWITCH}={os.environ[SWITCH]!r} is not a choice: 1 (the default) "
                         f"keeps freed blocks up to 32 MiB, {ALL!r} all of them, 0 leaves "
                         "glibc's allocator as it is")
    if switch == "0" or any(v in os.environ for v in GLIBC_VARIABLES):
        return False
    if libc is None:
        try:
            libc = ctypes.CDLL(None)
        except OSError:
            return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # not glibc (musl, macOS)
        return False
    limits = [(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
              (_M_TOP_PAD, TOP_PAD_BYTES)]
    if switch == ALL:
        limits.append((_M_MMAP_MAX, 0))
    return all(mallopt(parameter, value) == 1 for parameter, value in limits)
