"""The engine runs Arrow on the system allocator unless the user chose a pool."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from combined.runtime._memory import POOL_VARIABLE, use_system_allocator


@pytest.fixture
def pool() -> Iterator[None]:
    before = pa.default_memory_pool()
    yield
    pa.set_memory_pool(before)


def test_system_allocator_by_default(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POOL_VARIABLE, raising=False)
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    assert use_system_allocator() == "system"
    assert pa.default_memory_pool().backend_name == "system"
    # Arrow's own allocations go there from now on.
    before = pa.system_memory_pool().bytes_allocated()
    held = pa.array(range(100_000), pa.int64())
    assert pa.system_memory_pool().bytes_allocated() >= before + held.nbytes


def test_a_pool_named_in_the_environment_wins(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_VARIABLE, "mimalloc")
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    assert use_system_allocator() == "mimalloc"
    assert pa.default_memory_pool().backend_name == "mimalloc"


def test_the_engine_switches_the_pool(
    pool: None, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from combined.config import Project
    from combined.engine import Engine

    monkeypatch.delenv(POOL_VARIABLE, raising=False)
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    Engine(Project.model_validate({"version": 1, "lake": str(tmp_path)}))
    assert pa.default_memory_pool().backend_name == "system"
