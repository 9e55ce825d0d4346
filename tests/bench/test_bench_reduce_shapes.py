"""bench/reduce_shapes.py: a change stream staged by one process, reduced by another."""

from __future__ import annotations

from bench import reduce_shapes


def test_a_shape_is_staged_reduced_and_delivered_in_fresh_processes() -> None:
    c = reduce_shapes._child("list", 2_000, 3, 1)
    assert c["outcome"] == "ok"
    assert c["rows"] == 3_000  # each id's update, once
    assert c["cpu_s"] > 0 and c["peak_rss_mb"] > 0
