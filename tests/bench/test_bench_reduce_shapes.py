"""bench/reduce_shapes.py: a change stream staged by one process, reduced by another."""

from __future__ import annotations

import pytest

from bench import reduce_shapes

# (minutes of fresh processes in all: beside the parallel suite, which they would hold up)
pytestmark = pytest.mark.beside


def test_a_shape_is_staged_reduced_and_delivered_in_fresh_processes() -> None:
    c = reduce_shapes._child("list", 2_000, 3, 1)
    assert c["outcome"] == "ok"
    assert c["rows"] == 3_000  # each id's update, once
    assert c["cpu_s"] > 0 and c["peak_rss_mb"] > 0


def test_filled_rows_of_wide_byte_strings_drain_under_400_mb() -> None:
    # 1,250 updates leaving one of three 20 kB byte strings alone: the fill
    # join's output reached the hash as vectors of 2,048 rows (DuckDB gathers
    # a join's short chunks), 810 MB at the peak, outside DuckDB's limit.
    c = reduce_shapes._child("bytes", 20_000, 3, 1)
    assert c["outcome"] == "ok"
    assert c["rows"] == 1_250
    assert c["peak_rss_mb"] < 400, c


def test_filled_lists_of_hot_rows_drain_at_the_default_memory() -> None:
    # 200 rows of three filled lists of 100 kB, each updated ten times: 2,000
    # fills of 300 kB, over the reduction's memory. Held in a table, every
    # window's join read the lists of a whole vector (2,048 rows), and the
    # capture failed for memory at 256 MiB.
    c = reduce_shapes._child("list", 100_000, 3, 3, repeats=10)
    assert c["outcome"] == "ok", c
    assert c["rows"] == 200
    assert c["peak_rss_mb"] < 400, c


def test_filled_lists_of_many_short_strings_are_delivered_from_their_file() -> None:
    # Fills of 500-element lists read from their Parquet file: the reader's
    # buffers failed the delivery at the memory a fill table's join was given.
    c = reduce_shapes._child("manylist", 2_000, 3, 1)
    assert c["outcome"] == "ok", c
    assert c["rows"] == 3_000


def test_lists_of_many_short_strings_filled_from_the_lake_drain_under_400_mb() -> None:
    # Three lists of 5,000 strings an id, each filled from the lake's row
    # (its row groups of 16 MB): DuckDB read a row group as 34 MB of vectors
    # whatever it was asked for, and such fills failed at the default memory.
    c = reduce_shapes._child("manylist", 20_000, 3, 3, lake=True)
    assert c["outcome"] == "ok", c
    assert c["rows"] == 1_250
    assert c["peak_rss_mb"] < 400, c
