"""A snapshot's staged ids are proved distinct by their 64-bit prefixes, in bounded passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from combined.capture import _duplicates
from combined.capture._duplicates import distinct_prefixes


def digests(rows: int, seed: int) -> pa.Array:
    """``rows`` random 16-byte ids (identity encoding v2)."""
    data = np.random.default_rng(seed).bytes(16 * rows)
    offsets = np.arange(0, 16 * rows + 1, 16, dtype=np.int32).tobytes()
    return pa.Array.from_buffers(
        pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def part(path: Path, ids: pa.Array) -> Path:
    table = pa.table({"id": pa.array(range(len(ids)), pa.int64()), "_combined_id": ids})
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)
    return path


def _split_ids(tmp_path: Path, seed: int) -> tuple[pa.Array, list[Path], Path]:
    """12,000 random ids in two parts (5,000 and 7,000), and an empty spill directory."""
    ids = digests(12_000, seed=seed)
    parts = [
        part(tmp_path / "a.arrow", ids.slice(0, 5000)),
        part(tmp_path / "b.arrow", ids.slice(5000)),
    ]
    spill = tmp_path / "spill"
    spill.mkdir()
    return ids, parts, spill


@pytest.mark.parametrize("pass_bytes", [2**30, 8_000])  # one pass; 16 passes
def test_distinct_ids_are_proved_distinct_and_a_repeated_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pass_bytes: int
) -> None:
    monkeypatch.setattr(_duplicates, "PREFIX_PASS_BYTES", pass_bytes)
    ids = digests(12_000, seed=1)
    a = part(tmp_path / "a.arrow", ids.slice(0, 7000))
    b = part(tmp_path / "b.arrow", ids.slice(7000))
    assert distinct_prefixes([a, b])
    again = part(tmp_path / "c.arrow", pa.concat_arrays([digests(50, 2), ids.slice(6999, 1)]))
    assert not distinct_prefixes([a, b, again])


def test_the_ids_are_read_once_however_many_buckets_they_are_sorted_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12,000 ids of 8 bytes in buckets of 8,000 bytes: 16 buckets. Each part's
    # id column was read once a bucket (16 reads of every batch); now once.
    monkeypatch.setattr(_duplicates, "PREFIX_PASS_BYTES", 8_000)
    reads: list[int] = []
    first_words = _duplicates._first_words

    def counted(ids: pa.Array) -> np.ndarray | None:
        reads.append(len(ids))
        return first_words(ids)

    monkeypatch.setattr(_duplicates, "_first_words", counted)
    _, parts, spill = _split_ids(tmp_path, seed=3)
    assert distinct_prefixes(parts, spill)
    assert sum(reads) == 12_000
    assert list(spill.iterdir()) == []  # (its bucket files are gone)


class _Passes(np.ndarray):
    """Prefixes that count the element-wise operations (ufuncs) run over them."""

    calls: list[str] = []

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        _Passes.calls.append(ufunc.__name__)
        plain = [x.view(np.ndarray) if isinstance(x, _Passes) else x for x in inputs]
        result = getattr(ufunc, method)(*plain, **kwargs)
        return result.view(_Passes) if isinstance(result, np.ndarray) else result


def test_spreading_the_ids_to_buckets_passes_over_each_batch_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 16 buckets: a mask a bucket compared every batch's prefixes 16 times
    # over (the passes growing with the rows, as the buckets do); a radix
    # sort of the bucket numbers splits a batch in one pass.
    monkeypatch.setattr(_duplicates, "PREFIX_PASS_BYTES", 8_000)
    batches: list[int] = []
    first_words = _duplicates._first_words

    def counted(ids: pa.Array) -> np.ndarray | None:
        words = first_words(ids)
        batches.append(len(ids))
        return None if words is None else words.view(_Passes)

    monkeypatch.setattr(_duplicates, "_first_words", counted)
    monkeypatch.setattr(_Passes, "calls", [])
    ids, parts, spill = _split_ids(tmp_path, seed=4)
    assert distinct_prefixes(parts, spill)
    assert len(batches) == 12 and len(_Passes.calls) <= 2 * len(batches), _Passes.calls
    # ... and the buckets still meet a repeated id.
    again = part(tmp_path / "c.arrow", pa.concat_arrays([digests(50, 5), ids.slice(11_999, 1)]))
    assert not distinct_prefixes([*parts, again], spill)


def test_ids_sharing_only_their_first_64_bits_go_to_the_exact_check(tmp_path: Path) -> None:
    first = bytes(range(16))
    twin = first[:8] + bytes(8)
    ids = pa.array([first, twin], pa.binary())
    assert not distinct_prefixes([part(tmp_path / "a.arrow", ids)])


def test_hex_ids_and_parts_without_ids_are_left_to_the_exact_check(tmp_path: Path) -> None:
    hex_ids = pa.array([f"{i:032x}" for i in range(10)])
    assert not distinct_prefixes([part(tmp_path / "a.arrow", hex_ids)])
    bare = tmp_path / "b.arrow"
    with pa.ipc.new_file(str(bare), pa.schema([("id", pa.int64())])) as writer:
        writer.write_table(pa.table({"id": [1, 2]}))
    assert not distinct_prefixes([bare])


# A first baseline of 4M staged rows: the peak RSS of its duplicate check,
# over the reduction's opening, in a fresh interpreter.
_PROBE = """
import sys, tempfile
from pathlib import Path
import numpy as np, pyarrow as pa
from combined.capture._reduce import Reducer
from combined.runtime._memory import tune_allocators

tune_allocators()  # (as the engine does: two arenas, fixed thresholds)

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name):
            return int(line.split()[1]) * 1024

rows, per = 4_000_000, 500_000
with tempfile.TemporaryDirectory() as tmp:
    parts = []
    for n, start in enumerate(range(0, rows, per)):
        data = np.random.default_rng(n).bytes(32 * per)
        offsets = pa.py_buffer(np.arange(0, 16 * per + 1, 16, dtype=np.int32).tobytes())
        def digest(at):
            chunk = pa.py_buffer(data[at : at + 16 * per])
            return pa.Array.from_buffers(pa.binary(), per, [None, offsets, chunk])
        ids = pa.array(np.arange(start, start + per, dtype=np.int64))
        table = pa.table({"id": ids, "_combined_ordinal": ids,
                          "_combined_id": digest(0), "_combined_payload_hash": digest(16 * per)})
        parts.append(Path(tmp) / f"p{n}.arrow")
        with pa.ipc.new_file(str(parts[-1]), table.schema) as writer:
            writer.write_table(table, max_chunksize=65536)
    del table, data
    reducer = Reducer(
        capture_files=parts, capture_schema=pa.ipc.open_file(str(parts[0])).schema,
        current_files=[], key=["id"], strategy="snapshot", sync_mode="incremental",
        memory_limit=256 * 2**20, spill_dir=Path(tmp), baseline=True,
    )
    base = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    assert reducer.duplicates(limit=1) == []
    print((status("VmHWM") - base) >> 20)
    reducer.close()
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_the_duplicate_check_of_a_large_baseline_holds_little_memory() -> None:
    # DuckDB's sort of the ids' hashes rose ~107 MB here (and up to the
    # reduction memory, ~250 MB, at 20M rows); two passes of 16 MB of
    # prefixes each, gathered then joined, ~53 MB (83 once in CI: the
    # allocator's retention varies); spread to bucket files, ~20 MB.
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    assert int(out.stdout) < 50
