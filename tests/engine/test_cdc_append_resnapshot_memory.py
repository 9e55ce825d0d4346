"""An event stream's new snapshot compares 500k ids with their newest events under 400 MB.

Each id's newest event was ranked in one window over the lake's every event
(a window holds its rows: it does not spill): a new snapshot of a 500k-row
table peaked at 505-523 MB. The events are now written to a file per
bucket of their id (a partitioned write spills) and ranked a bucket at a
time, each sized by DuckDB's share of the reduction memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.engine.test_cdc_capture import PROJECT
from tests.engine.test_cdc_large_transaction import _peak_rss_mb

from combined.engine import Engine

ROWS = 500_000
#: What any capture may hold at its peak, at the default settings.
CEILING_MB = 400


@pytest.mark.beside  # (a 500k-row table's snapshot twice: ~20 s)
def test_a_new_snapshot_of_a_large_event_stream_stays_under_the_ceiling(
    tmp_path: Path, cdc_db: Any
) -> None:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text)")
        conn.execute(f"INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, {ROWS}) g")
    project = PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, table="items")
    (tmp_path / "combined.yaml").write_text(project + "        sync_mode: append\n")
    rc, _ = _peak_rss_mb(tmp_path, "cdc", "setup", "pg")  # the first snapshot
    assert rc == 0
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:  # the gap
        conn.execute("UPDATE items SET qty = -qty WHERE id % 1000 = 0")
        conn.execute("DELETE FROM items WHERE id % 1000 = 1")
    rc, _ = _peak_rss_mb(tmp_path, "cdc", "teardown", "pg", "--yes")
    assert rc == 0
    rc, peak = _peak_rss_mb(tmp_path, "cdc", "setup", "pg")  # the new snapshot
    assert rc == 0
    assert peak < CEILING_MB, f"peak RSS {peak:.0f} MB"
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        counts = engine.sql(
            "SELECT _combined_op AS op, count(*) AS n FROM pg.items GROUP BY 1 ORDER BY 1"
        ).to_pylist()
    finally:
        engine.close()
    changed = ROWS // 1000
    assert counts == [
        {"op": "delete", "n": changed},
        {"op": "snapshot", "n": ROWS},
        {"op": "update", "n": changed},
    ]
