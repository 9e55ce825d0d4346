"""The staged rows a comparison by value hashes: chosen by ordinal, a batch at a time."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from combined.capture._values import ORDINAL, _chosen


def _batch(ordinals: list[int] | np.ndarray) -> pa.RecordBatch:
    ords = np.asarray(ordinals, np.int64)
    return pa.record_batch({ORDINAL: pa.array(ords), "v": pa.array([f"r{o}" for o in ords])})


def _expected(batch: pa.RecordBatch, wanted: np.ndarray) -> pa.RecordBatch | None:
    keep = pc.is_in(batch.column(ORDINAL), value_set=pa.array(wanted, pa.int64()))
    return batch.filter(keep) if pc.any(keep).as_py() else None


@pytest.mark.parametrize(
    ("ordinals", "wanted"),
    [
        (range(10, 20), [10]),  # the first row
        (range(10, 20), [19]),  # the last row
        (range(10, 20), [3, 10, 15, 19, 20, 40]),  # both ends, and ordinals of other batches
        (range(10, 20), [0, 9, 20, 99]),  # none of this batch's
        (range(10, 20), list(range(10, 20))),  # every row
        ([5, 3, 4, 9, 7], [3, 7, 8]),  # not a run: matched ordinal by ordinal
        ([1, 2, 4, 5, 6], [2, 4, 6]),  # a gap: the same
        ([7], [7]),
    ],
)
def test_the_wanted_ordinals_are_chosen_as_a_set_lookup_chooses_them(
    ordinals: range | list[int], wanted: list[int]
) -> None:
    batch, ask = _batch(list(ordinals)), np.array(wanted, np.int64)
    got, expected = _chosen(batch, ask), _expected(batch, ask)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.equals(expected)


def test_nothing_is_chosen_from_an_empty_batch_or_for_no_ordinals() -> None:
    assert _chosen(_batch([]), np.array([1, 2], np.int64)) is None
    assert _chosen(_batch([1, 2]), np.array([], np.int64)) is None


def test_choosing_from_a_capture_does_not_build_a_set_per_batch() -> None:
    """5M staged ordinals, 1.6% wanted (a 1%-changed re-capture's candidates): the
    choice costs a small share of one set lookup per batch (which rebuilt the
    wanted set each time: ~0.15-0.5 CPU-s)."""
    rng = np.random.default_rng(7)
    n, step = 5_000_000, 65_536
    wanted = np.unique(rng.choice(n, 80_000, replace=False))
    batches = [
        pa.record_batch({ORDINAL: pa.array(np.arange(s, min(s + step, n)))})
        for s in range(0, n, step)
    ]
    value_set = pa.array(wanted)
    began = time.process_time()
    for b in batches:
        b.filter(pc.is_in(b.column(ORDINAL), value_set=value_set))
    per_batch_set = time.process_time() - began
    began = time.process_time()
    chosen = [_chosen(b, wanted) for b in batches]
    ours = time.process_time() - began
    assert sum(c.num_rows for c in chosen if c is not None) == len(wanted)
    assert ours < per_batch_set / 3, (ours, per_batch_set)
