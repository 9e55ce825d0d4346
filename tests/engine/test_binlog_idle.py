"""MariaDB binlog captures that find nothing new change nothing in the lake.

Each committed an empty Delivery when other tables' events moved the binlog
position: a lake version, a raw-layer file and a catalog Delivery a capture
(``test_idle_captures.py`` says the same of PostgreSQL). The position is now
kept beside the table (``lake._positions``) and the next read resumes there.
"""

from __future__ import annotations

from tests.engine._binlog import Binlog, lake

from combined.catalog import _schema as t
from combined.engine import Engine
from combined.lake import LakeTable


def _footprint(engine: Engine, binlog: Binlog) -> tuple[int, int, int]:
    """The table's lake version, its raw-layer files, the catalog's Deliveries."""
    table = LakeTable(binlog.root / "lake" / "db" / "items", "combined:db/items")
    raw = [p for p in (binlog.root / "lake" / "_deliveries").rglob("*") if p.is_file()]
    with engine.catalog.begin() as conn:
        deliveries = conn.execute(t.deliveries.select()).fetchall()
    return int(table.delta().version()), len(raw), len(deliveries)


def test_idle_binlog_captures_keep_their_position_and_no_lake_version(binlog: Binlog) -> None:
    engine = Engine.open(binlog.project())
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        footprint = _footprint(engine, binlog)
        other = f"other_{binlog.table}"
        binlog.sql(f"CREATE TABLE {other} (id INT)")
        seen = [binlog.checkpoint()["binlog"]]
        for n in range(3):
            binlog.sql(f"INSERT INTO {other} VALUES ({n})")
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            assert _footprint(engine, binlog) == footprint
            seen.append(binlog.checkpoint()["binlog"])
        assert len(set(seen)) == len(seen)  # each capture moved past the other table's events

        binlog.sql("UPDATE {t} SET qty = -1 WHERE id <= 4", "DELETE FROM {t} WHERE id = 5")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert (run.stats["items"]["updates"], run.stats["items"]["deletes"]) == (4, 1)
        assert lake(engine) == binlog.source()
        assert _footprint(engine, binlog)[0] == footprint[0] + 1
    finally:
        engine.close()
