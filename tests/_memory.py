"""The process's anonymous memory, sampled while a block runs (the memory tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def anonymous() -> int:
    """This process's anonymous resident bytes (its heaps, Arrow's and DuckDB's included)."""
    status = Path("/proc/self/status").read_text().split("RssAnon:")[1]
    return int(status.split()[0]) * 1024


@contextmanager
def anonymous_growth() -> Iterator[list[int]]:
    """Yield a list; on leaving, the most the anonymous memory grew meanwhile is appended."""
    start, peak, done = anonymous(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], anonymous())
            time.sleep(0.001)

    grown: list[int] = []
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield grown
    finally:
        done.set()
        sampler.join()
        grown.append(max(peak[0], anonymous()) - start)


def duckdb_unused() -> int:
    """Bytes DuckDB's jemalloc holds resident beyond what is allocated (freed, not purged)."""
    import ctypes
    import sys

    from combined.runtime._memory import _duckdb_mallctl

    mallctl = _duckdb_mallctl(sys.modules.get("_duckdb"))
    assert mallctl is not None, "DuckDB built without jemalloc"
    epoch, size = ctypes.c_uint64(1), ctypes.c_size_t(8)
    mallctl(b"epoch", None, None, ctypes.byref(epoch), 8)  # (statistics refreshed)
    values = []
    for name in (b"stats.resident", b"stats.allocated"):
        value = ctypes.c_size_t(0)
        assert mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0) == 0
        values.append(value.value)
    return values[0] - values[1]
