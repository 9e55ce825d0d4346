"""bench/cdc_shapes.py: a shape's CDC backlog made, drained in a fresh process and checked."""

from __future__ import annotations

import psycopg
import pytest

from bench import cdc_shapes

# (a backlog made and drained in fresh processes: beside the parallel suite)
pytestmark = pytest.mark.beside


def test_a_shape_backlog_is_drained_measured_and_checked(pg_server_dsn: str) -> None:
    r = cdc_shapes.drain(pg_server_dsn, "jsonbig", 20)
    assert "error" not in r, r
    assert r["changes"] == 20 + 1 + 1  # every row updated, id 7 deleted, one inserted
    assert r["lake_equals_source"] is True
    assert r["cpu_s"] > 0 and r["peak_rss_mb"] > 0
    with psycopg.connect(pg_server_dsn) as conn:  # (its database and slot went with it)
        name = "combined_cdc_shapes_jsonbig"
        left = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", (name,)
        ).fetchone()
        slots = conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE database = %s", (name,)
        ).fetchone()
    assert left == (0,) and slots == (0,)
