"""The fingerprint steps of a large re-capture: exact results, at a cost linear in the rows."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from combined.capture import _fingerprint as fp

_RNG = np.random.default_rng(25)


def _values(n: int, *extra: int) -> np.ndarray:
    """``n`` random sorted distinct 64-bit values, with ``extra`` among them."""
    drawn = _RNG.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    return np.unique(np.concatenate([drawn, np.array(extra, np.uint64)]))


_SHARED = _values(5000, 0, 2**64 - 1)
_CASES = {
    "both empty": (np.empty(0, np.uint64), np.empty(0, np.uint64)),
    "mine empty": (np.empty(0, np.uint64), _SHARED),
    "theirs empty": (_SHARED, np.empty(0, np.uint64)),
    "the same": (_SHARED, _SHARED),
    "disjoint": (_SHARED[::2], _SHARED[1::2]),
    "one change a side, at the ends": (_SHARED[1:], _SHARED[:-1]),
    "one value each": (_SHARED[:1], _SHARED[-1:]),
    "few against many": (_SHARED[::997], _SHARED),
    "mostly shared": (np.union1d(_SHARED[_SHARED % 7 != 1], _values(50)), _SHARED),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_the_fingerprints_of_one_side_only_are_the_symmetric_difference(case: str) -> None:
    mine, theirs = _CASES[case]
    found = fp.one_sided(mine.copy(), theirs.copy())
    assert found is not None and found.dtype == np.uint64
    expected = np.setxor1d(mine, theirs)
    assert np.array_equal(found, expected)
    # At most ``most`` of them, or None (the caller joins every row instead):
    # given up as soon as they are counted past it, never gathered whole.
    at_most = fp.one_sided(mine.copy(), theirs.copy(), len(expected))
    assert at_most is not None and np.array_equal(at_most, expected)
    if len(expected):
        assert fp.one_sided(mine.copy(), theirs.copy(), len(expected) - 1) is None


@pytest.mark.parametrize("spill", [False, True])
def test_a_recapture_whose_every_fingerprint_is_one_sided_gives_up_by_its_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill: bool
) -> None:
    """Every row changed: 2x3000 one-sided fingerprints against ``most`` 1000.

    Before, every one of them was gathered (10M, 80 MB and its copies at
    5M rows changed, the reduction's peak) and then found too many.
    """
    ids, old, new = _digests(3000), _digests(3000), _digests(3000)
    ords = list(range(3000))
    looked: list[int] = []
    real = fp.one_sided

    def counted(mine: np.ndarray, theirs: np.ndarray, most: int | None = None) -> object:
        looked.append(-1 if most is None else most)
        return real(mine, theirs, most)

    monkeypatch.setattr(fp, "one_sided", counted)
    where = (tmp_path, 2) if spill else None  # (4 buckets, their budget shared)
    found = fp.candidates(
        _batches(ords, ids, new), 3000, _batches(ids, old), 3000, where, most=1000
    )
    assert found is None
    assert looked and all(0 <= m <= 1000 for m in looked)
    few = [*old[:2990], *new[2990:]]  # 10 rows changed: 20 one-sided
    found = fp.candidates(_batches(ords, ids, few), 3000, _batches(ids, old), 3000, where, most=20)
    assert found is not None and found.staged.num_rows == 10


def test_few_lookups_pass_the_prefilter_of_many_one_sided_fingerprints() -> None:
    # A 20M-row table's 1%-changed re-capture has ~640k one-sided fingerprints:
    # a map of 2**22 entries let 14% of its 60M lookups through to the exact
    # search, a share growing with the table (the step was faster than linear).
    values = _values(640_000)
    members = fp.Members(values)
    lookups = _values(1_000_000)
    assert members._map[lookups >> members._shift].mean() < 0.05
    probe = np.concatenate([values[::7], lookups[:50_000]])
    assert np.array_equal(members(probe), np.isin(probe, values))


def _digests(n: int) -> list[bytes]:
    return [os.urandom(16) for _ in range(n)]


def _batches(*columns: list[bytes] | list[int]) -> fp.Reader:
    """A reader of the columns, in batches of 700 rows."""

    def read() -> Iterator[pa.RecordBatch]:
        for start in range(0, len(columns[0]), 700):
            arrays = [
                pa.array(c[start : start + 700], pa.int64() if isinstance(c[0], int) else None)
                for c in columns
            ]
            yield pa.RecordBatch.from_arrays(arrays, names=[f"c{k}" for k in range(len(arrays))])

    return read


def test_each_fingerprint_goes_to_the_file_of_its_bucket(tmp_path: Path) -> None:
    ids, hashes = _digests(5000), _digests(5000)
    batches = _batches(ids, hashes)
    g = fp._spread(((b.column(0), b.column(1)) for b in batches()), 5000, 6, tmp_path / "c")
    every = fp.prints(pa.array(ids), pa.array(hashes))
    assert every is not None and g == fp._xor(every.g)
    top = every.f >> np.uint64(58)
    for bucket in range(64):
        written = np.fromfile(tmp_path / f"c{bucket}", np.uint64)
        assert np.array_equal(written, every.f[top == bucket])  # (in the rows' order)


@pytest.mark.parametrize("bits", [None, 3])  # at once; in 8 buckets
def test_the_candidates_are_the_pairs_of_one_side_and_the_rows_of_their_ids(
    tmp_path: Path, bits: int | None
) -> None:
    lake_ids, lake_hashes = _digests(6000), _digests(6000)
    # 60 updated, 6 deleted, 30 new, 5 new ids sharing their first 64 bits with
    # a lake row's (an unchanged one: kept for the duplicate check, not a change)
    rows = [(i, h) for k, (i, h) in enumerate(zip(lake_ids, lake_hashes, strict=True)) if k % 1000]
    rows = [(i, os.urandom(16) if k % 100 == 50 else h) for k, (i, h) in enumerate(rows)]
    twins = [lake_ids[k][:8] + os.urandom(8) for k in (1, 2, 3, 4, 5)]
    rows += [(i, os.urandom(16)) for i in [*_digests(30), *twins]]
    staged_ids, staged_hashes = [i for i, _ in rows], [h for _, h in rows]
    found = fp.candidates(
        _batches(list(range(len(rows))), staged_ids, staged_hashes),
        len(rows),
        _batches(lake_ids, lake_hashes),
        6000,
        None if bits is None else (tmp_path, bits),
    )
    assert found is not None
    lake = set(zip(lake_ids, lake_hashes, strict=True))
    mine = set(zip(staged_ids, staged_hashes, strict=True))
    staged = found.staged.to_pydict()
    assert set(zip(staged["_cid"], staged["_chash"], strict=True)) == mine - lake
    current = found.current.to_pydict()
    kept = list(zip(current["_kid"], current["_khash"], current["_kf"], strict=True))
    assert {(i, h) for i, h, f in kept if f} == lake - mine
    words = {i[:8] for i, _ in mine - lake}
    assert {(i, h) for i, h, f in kept if not f} == {
        (i, h) for i, h in lake & mine if i[:8] in words
    }
    assert len({i for i, _, f in kept if not f}) == 5  # (the twins' lake rows)
