"""The engine tunes the allocators unless the user chose their settings."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from combined import _alloc
from combined._alloc import POOL_VARIABLE
from combined.runtime._memory import (
    ARENA_VARIABLE,
    MMAP_VARIABLE,
    TRIM_VARIABLE,
    fix_mmap_threshold,
    use_system_allocator,
)


@pytest.fixture
def pool() -> Iterator[None]:
    before = pa.default_memory_pool()
    yield
    pa.set_memory_pool(before)


def test_system_allocator_by_default(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_alloc, "USER_POOL", None)
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    assert use_system_allocator() == "system"
    assert pa.default_memory_pool().backend_name == "system"
    # Arrow's own allocations go there from now on.
    before = pa.system_memory_pool().bytes_allocated()
    held = pa.array(range(100_000), pa.int64())
    assert pa.system_memory_pool().bytes_allocated() >= before + held.nbytes


def test_a_pool_named_in_the_environment_wins(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_alloc, "USER_POOL", "mimalloc")  # as read when Combined was imported
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    assert use_system_allocator() == "mimalloc"
    assert pa.default_memory_pool().backend_name == "mimalloc"


def test_the_engine_switches_the_pool(
    pool: None, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from combined.config import Project
    from combined.engine import Engine

    monkeypatch.setattr(_alloc, "USER_POOL", None)
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    Engine(Project.model_validate({"version": 1, "lake": str(tmp_path)}))
    assert pa.default_memory_pool().backend_name == "system"


_ORDER = """
import sys
if sys.argv[1] == "combined first":
    import combined
    import pyarrow as pa
else:
    import pyarrow as pa
    import combined
from combined import _alloc
print(pa.default_memory_pool().backend_name, _alloc.EARLY)
"""


@pytest.mark.parametrize(
    ("order", "user", "expected"),
    [
        ("combined first", None, "system True"),  # the whole of Arrow, C++ included
        ("combined first", "mimalloc", "mimalloc False"),  # the user's choice wins
        ("pyarrow first", None, "default False"),  # too late: the engine switches Python's
    ],
)
def test_the_package_names_arrows_pool_before_pyarrow_loads(
    order: str, user: str | None, expected: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != POOL_VARIABLE}
    if user is not None:
        env[POOL_VARIABLE] = user
    out = subprocess.run(
        [sys.executable, "-c", _ORDER, order], env=env, capture_output=True, text=True, check=True
    )
    pool, early = out.stdout.split()
    want_pool, want_early = expected.split()
    assert early == want_early
    # pyarrow's own default (mimalloc in today's wheels) when Combined came too late
    assert pool == want_pool if want_pool != "default" else pool != "system"


_PROBE = """
import ctypes, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
if sys.argv[1] == "fixed":
    from combined.runtime._memory import fix_mmap_threshold
    assert fix_mmap_threshold()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 16 << 20
block = libc.malloc(size)  # mapped; freeing it raises glibc's dynamic threshold
ctypes.memset(block, 1, size)
libc.free(block)
block = libc.malloc(size)
ctypes.memset(block, 1, size)
pin = libc.malloc(4096)  # the heap's top stays in use
held = rss()
libc.free(block)
print(held - rss())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
@pytest.mark.parametrize("mode", ["fixed", "dynamic"])
def test_a_fixed_mmap_threshold_gives_large_blocks_back_on_free(mode: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != MMAP_VARIABLE}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], env=env, capture_output=True, text=True, check=True
    )
    released_mb = int(out.stdout)
    # glibc's dynamic threshold keeps the second block in the heap, resident.
    assert released_mb >= 15 if mode == "fixed" else released_mb < 8


def test_a_threshold_in_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MMAP_VARIABLE, "4194304")
    assert fix_mmap_threshold() is False  # glibc took the user's at start-up
    monkeypatch.delenv(MMAP_VARIABLE)
    assert fix_mmap_threshold(0) is False


_TRIM_PROBE = """
import ctypes, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
from combined.runtime._memory import fix_mmap_threshold, raise_trim_threshold, release_memory
assert fix_mmap_threshold()
assert raise_trim_threshold() is (sys.argv[1] == "raised")
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(1 << 20) for _ in range(64)]  # under the mmap threshold: the heap
for block in blocks:
    ctypes.memset(block, 1, 1 << 20)
held = rss()
for block in reversed(blocks):  # the heap's top grows back to 64 MB free
    libc.free(block)
freed = rss()
release_memory()
print(held - freed, held - rss())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
@pytest.mark.parametrize("mode", ["raised", "user"])
def test_freed_heap_memory_is_kept_for_reuse_until_a_phase_gives_it_back(mode: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (MMAP_VARIABLE, TRIM_VARIABLE)}
    if mode == "user":
        env[TRIM_VARIABLE] = str(128 << 10)  # the user's (glibc's default) wins
    out = _run(_TRIM_PROBE, mode, env)
    on_free, on_release = (int(v) for v in out.stdout.split())
    # Raised, a free leaves the pages for the next allocation (no fault to
    # take them back); the user's low threshold trims on every such free.
    assert on_free < 8 if mode == "raised" else on_free >= 56
    assert on_release >= 56  # release_memory() trims the heaps at a phase boundary


_ARENA_PROBE = """
import ctypes, sys, threading
from combined.runtime._memory import limit_arenas
print(limit_arenas() if sys.argv[1] != "default" else None)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
start = threading.Barrier(8)
def allocate():
    start.wait()  # all at once: each new thread takes a heap of its own while it may
    block = libc.malloc(1 << 20)
    ctypes.memset(block, 1, 1 << 20)
    start.wait()
    libc.free(block)
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.malloc_stats()  # one "Arena <n>:" line a heap, on stderr
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
@pytest.mark.parametrize(
    ("mode", "set_", "heaps"),
    [("limited", "True", 2), ("default", "None", 9), ("user", "False", 5)],
)  # glibc's default: a heap for each of the 8 threads and the main one, or more
def test_threads_share_two_heaps_unless_the_user_chose(mode: str, set_: str, heaps: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != ARENA_VARIABLE}
    if mode == "user":
        env[ARENA_VARIABLE] = "5"  # the user's wins
    out = _run(_ARENA_PROBE, mode, env)
    assert out.stdout.strip() == set_
    found = out.stderr.count("Arena ")
    assert found >= heaps if mode == "default" else found == heaps


def _run(probe: str, mode: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``probe`` run in a fresh interpreter with ``mode`` as its argument."""
    return subprocess.run(
        [sys.executable, "-c", probe, mode], env=env, capture_output=True, text=True, check=True
    )


# An idle DuckDB database (the lake's shared one is never closed) after a
# query that freed what it built: RssAnon before and after release_memory.
_IDLE_DUCKDB = """
import duckdb
from combined.runtime._memory import release_memory

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) >> 10

con = duckdb.connect(config={"threads": 2})
con.execute("CREATE TABLE t AS SELECT range AS i, md5(range::VARCHAR) AS s FROM range(1000000)")
con.execute("SELECT s, count(*) FROM t GROUP BY s ORDER BY 2 DESC LIMIT 1").fetchall()
con.execute("DROP TABLE t")
before = anon()
release_memory()
print(before - anon())
"""


@pytest.mark.skipif(platform.system() != "Linux", reason="reads /proc")
def test_release_memory_gives_back_what_an_idle_duckdb_database_kept() -> None:
    # DuckDB's jemalloc purges freed pages only as its next allocations go:
    # an idle database kept them (gave back ~0 MB here; ~130 MB once purged).
    out = subprocess.run(
        [sys.executable, "-c", _IDLE_DUCKDB], capture_output=True, text=True, check=True
    )
    assert int(out.stdout) > 50


# A phase that freed little, then one that freed 64 MB: how many times
# release_memory() gave memory back, and what the second phase gave back.
_SMALL_PHASES = """
import ctypes
from combined.runtime import _memory
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
assert _memory.fix_mmap_threshold() and _memory.raise_trim_threshold()
purges = []
purge = _memory.purge_duckdb
_memory.purge_duckdb = lambda: purges.append(1) or purge()
_memory.release_memory()
small = bytearray(1 << 20)  # a small table's phase
del small
_memory.release_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(1 << 20) for _ in range(64)]
for block in blocks:
    ctypes.memset(block, 1, 1 << 20)
for block in reversed(blocks):
    libc.free(block)
held = rss()
_memory.release_memory()
print(len(purges), held - rss())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_a_phase_that_freed_little_gives_nothing_back() -> None:
    # A capture of 200 small tables released ~1,400 times, each a trim, a
    # purge and then the page faults of taking the pages again (~290k).
    env = {k: v for k, v in os.environ.items() if k not in (MMAP_VARIABLE, TRIM_VARIABLE)}
    purges, given_back = (int(v) for v in _run(_SMALL_PHASES, "", env).stdout.split())
    assert purges == 2  # the first, then the one after 64 MB were freed: not the small one
    assert given_back >= 56


def test_a_steps_room_is_its_limit_less_what_the_process_holds() -> None:
    """A step's room (the fingerprints' buckets) is its limit less the resident memory
    held, never under a share of it."""
    import numpy as np

    from combined.runtime._memory import held_resident, room_left

    limit = 2**40  # (far above what this process holds: the difference shows)
    before = room_left(limit)
    held = np.ones(64 * 2**20, np.uint8)  # 64 MB touched
    after = room_left(limit)
    assert held.sum() == len(held)
    assert 48 * 2**20 <= before - after <= 80 * 2**20, (before, after)
    small = held_resident() // 2  # (less than held: a quarter of it is left)
    assert room_left(small, share=4) == small // 4


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_a_steps_room_counts_the_pages_of_the_files_the_process_maps(tmp_path: Path) -> None:
    """The pages of mapped files (the libraries' code, ~210 MB through a 5M-row
    re-capture on a 6.18 kernel) count against a step's room as the heaps do: a
    peak RSS counts them."""
    import mmap

    from combined.runtime._memory import room_left

    path = tmp_path / "mapped"
    path.write_bytes(b"\1" * (64 * 2**20))
    limit = 2**40
    before = room_left(limit)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        pages = range(0, len(mapped), mmap.PAGESIZE)
        touched = sum(mapped[i] for i in pages)  # (every page read: resident)
        after = room_left(limit)
    assert touched == len(pages)
    assert 48 * 2**20 <= before - after <= 80 * 2**20, (before, after)
