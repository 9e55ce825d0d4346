"""The process's Arrow allocator.

pyarrow allocates through mimalloc by default. Measured on the benchmark's
2M-row snapshot (bench/RESULTS.md), the C library's allocator held ~80 MB
less at the peak and took ~0.5 CPU-s less: a capture's buffers are large and
short-lived, and mimalloc kept more of them mapped between batches. The
engine therefore switches Arrow to the system allocator once per process,
unless ``ARROW_DEFAULT_MEMORY_POOL`` names a pool explicitly (that choice wins).
"""

from __future__ import annotations

import os
import threading

import pyarrow as pa

#: The environment variable pyarrow itself reads at import to pick its pool.
POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"

_lock = threading.Lock()


def use_system_allocator() -> str:
    """Make the system allocator Arrow's default pool; return the pool in use.

    Buffers allocated before keep their own pool, so this is safe at any time.
    """
    with _lock:
        if not os.environ.get(POOL_VARIABLE):
            pool = pa.system_memory_pool()
            if pa.default_memory_pool().backend_name != pool.backend_name:
                pa.set_memory_pool(pool)
        return str(pa.default_memory_pool().backend_name)
