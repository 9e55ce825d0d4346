"""The process's allocators, tuned for a capture's large, short-lived buffers.

Two settings, each measured on the benchmark's 2M-row snapshot (bench/RESULTS.md):

- **Arrow's pool.** pyarrow allocates through mimalloc by default; the C
  library's allocator held less at every peak (initial snapshot ~-80 MB and
  ~-0.5 CPU-s when only Python's allocations moved; all cases -20 to -60 MB
  more when Arrow's C++ code moved too). :mod:`combined._alloc` names the
  system pool in the environment before pyarrow loads; when pyarrow was
  loaded first, :func:`use_system_allocator` switches what it can (the pool
  Python code allocates from). ``ARROW_DEFAULT_MEMORY_POOL``, when the user
  set it, wins either way.
- **glibc's mmap threshold.** glibc raises its threshold (up to 32 MB) each
  time a large block is freed, after which large buffers come from the heap,
  where a freed block stays resident until the heap's top is free. A fixed
  1 MiB threshold maps each large buffer and unmaps it on free: ~40 MB less at
  the peak of a snapshot, for no measurable time. ``MALLOC_MMAP_THRESHOLD_``,
  when set, wins (glibc read it at start-up).

The engine applies both once per process (:func:`tune_allocators`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading

import pyarrow as pa

from combined import _alloc

#: glibc's own environment form of the mmap threshold.
MMAP_VARIABLE = "MALLOC_MMAP_THRESHOLD_"
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h

_lock = threading.Lock()


def use_system_allocator() -> str:
    """Make the system allocator Arrow's default pool; return the pool in use.

    Buffers allocated before keep their own pool, so this is safe at any time.
    """
    with _lock:
        if _alloc.USER_POOL is None:
            pool = pa.system_memory_pool()
            if pa.default_memory_pool().backend_name != pool.backend_name:
                pa.set_memory_pool(pool)
        return str(pa.default_memory_pool().backend_name)


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; whether it was set.

    Nothing happens on another C library, or when ``MALLOC_MMAP_THRESHOLD_``
    chose a threshold already.
    """
    if threshold <= 0 or os.environ.get(MMAP_VARIABLE) or platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:  # pragma: no cover - glibc always has its libc
        return False
    libc = ctypes.CDLL(name)
    return bool(libc.mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(threshold)))


def tune_allocators() -> None:
    """Apply both settings (idempotent)."""
    use_system_allocator()
    fix_mmap_threshold()
