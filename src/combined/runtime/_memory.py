"""The process's allocators, tuned for a capture's large, short-lived buffers.

Three settings, measured on the benchmark's 2M-row snapshot and a CDC backlog
(bench/RESULTS.md):

- **Arrow's pool.** pyarrow allocates through mimalloc by default; the C
  library's allocator held less at every peak (initial snapshot ~-80 MB and
  ~-0.5 CPU-s when only Python's allocations moved; all cases -20 to -60 MB
  more when Arrow's C++ code moved too). :mod:`combined._alloc` names the
  system pool in the environment before pyarrow loads; when pyarrow was
  loaded first, :func:`use_system_allocator` switches what it can (the pool
  Python code allocates from). ``ARROW_DEFAULT_MEMORY_POOL``, when the user
  set it, wins either way.
- **glibc's mmap and trim thresholds.** glibc raises its mmap threshold (up
  to 32 MB) each time a large block is freed, after which large buffers come
  from the heap, where a freed block stays resident until the heap's top is
  free: a fixed threshold keeps the peak down (1 MiB: ~40 MB less at a
  snapshot's peak than the dynamic one). Fixing it also fixes the trim
  threshold at 128 KiB, and then every free that leaves the top of a heap
  larger than that gives the pages back, which the next allocation faults in
  again: a 2M-row snapshot took ~300k page faults, ~2.3 of its ~15 CPU-s in
  the kernel on a 2-core VM. A 4 MiB mmap threshold with a 256 MiB trim
  threshold took ~140k faults and ~1 CPU-s less in all, for ~+27 MB at the
  peak (bench/RESULTS.md). What the heaps keep is given back at the phase
  boundaries instead (:func:`release_memory`). ``MALLOC_MMAP_THRESHOLD_`` and
  ``MALLOC_TRIM_THRESHOLD_``, when set, win (glibc read them at start-up).
- **glibc's arenas.** At most two heaps for all threads (:func:`limit_arenas`):
  each heap keeps its own freed memory between the phase boundaries.
- **DuckDB's jemalloc.** DuckDB allocates through a jemalloc of its own, whose
  freed pages wait for a decay that only its next allocations advance: the
  lake's shared database (a commit's rows to remove, MAR) is idle after a
  query, and kept ~40 MB of a 5M-row commit's scan until the process ended
  (bench/RESULTS.md). :func:`release_memory` purges it too.

The engine applies these once per process (:func:`tune_allocators`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import sys
import threading
from typing import Any

import pyarrow as pa

from combined import _alloc

#: glibc's own environment forms of the mmap and trim thresholds.
MMAP_VARIABLE = "MALLOC_MMAP_THRESHOLD_"
TRIM_VARIABLE = "MALLOC_TRIM_THRESHOLD_"
ARENA_VARIABLE = "MALLOC_ARENA_MAX"
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 256 << 20
ARENA_MAX = 2
# mallopt's parameter numbers, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
#: jemalloc's name for every arena at once (``MALLCTL_ARENAS_ALL``).
_ARENAS_ALL = 4096

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


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, when it is glibc (whose malloc these settings are for).

    Looked up once: ``find_library`` runs ``ldconfig`` (a few ms), and
    :func:`release_memory` asks at every phase boundary.
    """
    if platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name)


def _mallopt(param: int, value: int, variable: str) -> bool:
    if value <= 0 or os.environ.get(variable):
        return False
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)))


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; whether it was set.

    Nothing happens on another C library, or when ``MALLOC_MMAP_THRESHOLD_``
    chose a threshold already.
    """
    return _mallopt(_M_MMAP_THRESHOLD, threshold, MMAP_VARIABLE)


def raise_trim_threshold(threshold: int = TRIM_THRESHOLD) -> bool:
    """Let glibc's heaps keep up to ``threshold`` free bytes at their top; whether it was set.

    Nothing happens on another C library, or when ``MALLOC_TRIM_THRESHOLD_``
    chose a threshold already.
    """
    return _mallopt(_M_TRIM_THRESHOLD, threshold, TRIM_VARIABLE)


def limit_arenas(arenas: int = ARENA_MAX) -> bool:
    """Let glibc's threads share at most ``arenas`` heaps; whether it was set.

    Each heap keeps what its threads freed (up to the trim threshold) until
    :func:`release_memory`: with a heap a thread (the reading, staging,
    DuckDB's and the Delivery writers'), a phase held the sum of their
    peaks. Two heaps: a CDC backlog's commit and MAR peaked ~20 MB lower,
    its Deliveries ~15 MB (bench/RESULTS.md). Nothing happens on another C
    library, or when ``MALLOC_ARENA_MAX`` chose a number already.
    """
    return _mallopt(_M_ARENA_MAX, arenas, ARENA_VARIABLE)


#: Growth of resident memory since the last release below which :func:`release_memory`
#: gives nothing back: what a small table's phase freed is reused by the next.
RELEASE_GROWTH = 16 << 20

#: Resident bytes after the last release (0: none yet).
_released_at = 0


def release_memory() -> None:
    """Give back what Arrow's pool, glibc's heaps and DuckDB's jemalloc hold unused.

    At a phase boundary. Arrow's system pool does not trim glibc's heaps
    itself, and with the raised trim threshold they keep what a phase freed
    until told; DuckDB's jemalloc keeps what an idle database freed.

    Unless resident memory grew by less than :data:`RELEASE_GROWTH` since
    the last release: a phase of a small table frees a few MB, and giving
    them back cost each of its phases the trim and the purge and then the
    page faults of taking them again (a capture of 200 small tables, one
    row changed in each: ~1,400 releases, ~290k of its ~620k page faults).
    A phase that held more than that still gives it back before the next.
    """
    global _released_at
    held = _resident()
    if held is not None and held < _released_at + RELEASE_GROWTH:
        return
    pa.default_memory_pool().release_unused()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(ctypes.c_size_t(0))
    purge_duckdb()
    _released_at = _resident() or 0


def _resident() -> int | None:
    """The process's resident bytes (None where ``/proc`` does not tell)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def held_anonymous() -> int:
    """The anonymous memory this process holds now, in bytes (0 where ``/proc`` does not say).

    Its heaps and buffers, not the pages of its libraries' files (``RssAnon``
    of ``/proc/self/status``): what a step's working memory comes on top of.
    """
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def purge_duckdb() -> bool:
    """Give back the pages DuckDB's jemalloc holds freed; whether it could.

    What DuckDB does when a database closes (its ``Allocator::FlushAll``),
    for the ones that stay open: this thread's cache flushed, every arena
    purged. Nothing happens before DuckDB is loaded (it is not loaded for
    this), or with a DuckDB built without jemalloc.
    """
    mallctl = _duckdb_mallctl(sys.modules.get("_duckdb"))
    if mallctl is None:
        return False
    mallctl(b"thread.tcache.flush", None, None, None, 0)
    return bool(mallctl(f"arena.{_ARENAS_ALL}.purge".encode(), None, None, None, 0) == 0)


@functools.cache
def _duckdb_mallctl(module: Any) -> Any:
    """jemalloc's ``mallctl`` in DuckDB's extension module (None: not there)."""
    path = getattr(module, "__file__", None)
    if not path:
        return None
    try:
        mallctl = ctypes.CDLL(path).duckdb_je_mallctl
    except (OSError, AttributeError):
        return None
    mallctl.restype = ctypes.c_int
    mallctl.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    return mallctl


def tune_allocators() -> None:
    """Apply the settings (idempotent)."""
    use_system_allocator()
    fix_mmap_threshold()
    raise_trim_threshold()
    limit_arenas()


def room_left(limit: int, share: int = 4) -> int:
    """What of a step's memory ``limit`` is left beside what the process holds, in bytes.

    The limit less the resident memory held now (:func:`held_resident`),
    never under a ``share``-th of it: a budget the process's peak keeps to
    whatever the imports and the earlier steps left.
    """
    limit = max(limit, 1)
    return max(limit - held_resident(), limit // share, 1)


def held_resident() -> int:
    """The memory this process holds resident now, in bytes (0 where ``/proc`` does not say).

    The anonymous memory (:func:`held_anonymous`) and the pages of the
    files it maps, its libraries' code above all (``VmRSS``): what a peak
    RSS counts. The mapped pages are no constant of the code: on a 2-core
    VM with kernel 6.18 they were ~136 MB after the imports and ~210 MB
    through a 5M-row re-capture (DuckDB's and delta-rs' libraries ~50-60
    MB each), where the anonymous memory alone left a 5M-row table's
    fingerprints a room a few MB either side of their 160 MB: sorted at
    once in some runs (a 431 MB peak), by 2 buckets in others (~400)
    (bench/RESULTS.md, forty-eighth session).
    """
    return _resident() or 0
