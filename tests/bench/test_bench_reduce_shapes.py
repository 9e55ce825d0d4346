"""bench/reduce_shapes.py: a change stream staged by one process, reduced by another."""

from __future__ import annotations

from bench import reduce_shapes


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
