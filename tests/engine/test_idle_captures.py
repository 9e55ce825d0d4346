"""Captures that find nothing new: what they keep, and that they change nothing in the lake.

A change stream captured while its tables are idle (other tables write, and
each bounded run writes its own end marker) committed an empty Delivery each
time: one lake version, one raw-layer file and one catalog Delivery a capture,
~525,000 a year at one a minute. A cursor read whose rows were all in the lake
unchanged (after a reset voided its checkpoint) kept no checkpoint at all, and
every later capture read the whole table again. Both now keep the position
beside the table (``lake._positions``), the slot confirmed past it.
"""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg

from combined.catalog import _schema as t
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._replication import slot_status
from combined.engine import Engine
from combined.lake import LakeTable

PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
      slot_prefix: {prefix}
    datasets:
      items:
        relation: public.items
        key: [id]
        {strategy}
"""
CDC = "strategy: cdc"
CURSOR = (
    "strategy: cursor\n"
    '        cursor: {column: seen, trust: "a sequence the application only raises"}'
)


def _project(root: Path, dsn: str, strategy: str, prefix: str = "ct_cursor") -> Path:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, seen bigint NOT NULL)")
        conn.execute("INSERT INTO items SELECT g, g, g FROM generate_series(1, 200) g")
        conn.execute("CREATE TABLE other (id int)")
    path = root / "combined.yaml"
    path.write_text(PROJECT.format(dsn=dsn, prefix=prefix, strategy=strategy))
    return path


def _footprint(engine: Engine, root: Path) -> tuple[int, int, int]:
    """The table's lake version, its raw-layer files, the catalog's Deliveries."""
    table = LakeTable(root / "lake" / "pg" / "items", "combined:pg/items")
    delta = table.delta()
    raw = [p for p in (root / "lake" / "_deliveries").rglob("*") if p.is_file()]
    with engine.catalog.begin() as conn:
        deliveries = conn.execute(t.deliveries.select()).fetchall()
    return int(delta.version()), len(raw), len(deliveries)


def _lsn(engine: Engine) -> int:
    from combined.connectors.postgres._pgoutput import text_to_lsn

    checkpoint = engine.committed_checkpoint("pg", "items")
    assert checkpoint is not None
    return int(text_to_lsn(checkpoint["lsn"]))


def _rows(engine: Engine) -> list[tuple[object, ...]]:
    rows = engine.sql("SELECT id, qty, seen FROM pg.items ORDER BY id").to_pylist()
    return [tuple(r.values()) for r in rows]


def _source(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute("SELECT id, qty, seen FROM items ORDER BY id"))


def test_idle_stream_captures_change_nothing_in_the_lake_and_still_free_the_wal(
    tmp_path: Path, cdc_db
) -> None:
    path = _project(tmp_path, cdc_db.dsn, CDC, cdc_db.prefix)
    slot = cdc_db.slot("public.items")
    engine = Engine.open(path)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        footprint = _footprint(engine, tmp_path)
        confirmed = slot_status(Settings(cdc_db.dsn), slot).confirmed_flush_lsn
        for _ in range(3):
            with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO other SELECT generate_series(1, 100)")
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            # no lake version, no raw-layer file, no catalog Delivery
            assert _footprint(engine, tmp_path) == footprint
            # the slot still moves past the other table's WAL (the server recycles it),
            # and never past where the next read resumes
            now = slot_status(Settings(cdc_db.dsn), slot).confirmed_flush_lsn
            assert confirmed is not None and now is not None and now > confirmed
            assert now <= _lsn(engine)
            confirmed = now
        # the idle capture read the source: its data is as fresh as that read
        (row,) = engine.status(slots=False)
        (last,) = engine.runs(limit=1)
        assert row["position_at"] is not None and row["position_at"] >= last.started_at, row
        # and publishes it: no lake version is left unpublished (status said one was, each time)
        resumed = engine.committed_checkpoint("pg", "items")
        assert resumed is not None and row["position"] == resumed["lsn"], row
        assert row["unpublished"] is None, row

        with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = -1 WHERE id <= 5")
            conn.execute("DELETE FROM items WHERE id = 6")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert (run.stats["items"]["updates"], run.stats["items"]["deletes"]) == (5, 1)
        assert _rows(engine) == _source(cdc_db.dsn)
        assert _footprint(engine, tmp_path)[0] == footprint[0] + 1
        # the commit's own checkpoint is where reads resume again, past the kept one
        meta = LakeTable(tmp_path / "lake" / "pg" / "items", "combined:pg/items").latest_commit()
        assert meta is not None
        assert engine.committed_checkpoint("pg", "items") == meta["checkpoint"]
    finally:
        engine.close()


def test_a_run_killed_after_keeping_an_idle_position_resumes_from_it(
    tmp_path: Path, cdc_db, tools
) -> None:
    """Killed once the position is kept, before the slot is acknowledged: the slot
    stays behind it (never ahead), and the next capture resumes from it, exactly once."""
    path = _project(tmp_path, cdc_db.dsn, CDC, cdc_db.prefix)
    slot = cdc_db.slot("public.items")
    assert tools.cli(tmp_path, "capture").returncode == 0
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO other SELECT generate_series(1, 100)")
    before = slot_status(Settings(cdc_db.dsn), slot).confirmed_flush_lsn
    killed = tools.cli(tmp_path, "capture", env={"COMBINED_FAULT": "after_projection"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert slot_status(Settings(cdc_db.dsn), slot).confirmed_flush_lsn == before
    assert (tmp_path / "lake" / "_combined" / "positions" / "pg" / "items.json").exists()

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET qty = -1 WHERE id = 1")
    again = tools.cli(tmp_path, "capture")
    assert again.returncode == 0, again.stderr
    engine = Engine.open(path)
    try:
        assert _rows(engine) == _source(cdc_db.dsn)
        confirmed = slot_status(Settings(cdc_db.dsn), slot).confirmed_flush_lsn
        assert confirmed is not None and before is not None and confirmed > before
    finally:
        engine.close()


def test_a_cursor_read_of_rows_the_lake_holds_unchanged_moves_the_cursor(
    tmp_path: Path, pg_database: str
) -> None:
    """After a reset voided the checkpoint, the first read finds every row unchanged:
    the cursor it read to is kept, and later captures read only what is newer."""
    path = _project(tmp_path, pg_database, CURSOR)
    engine = Engine.open(path)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        engine.reset_checkpoint("pg", "items", "read everything again")
        footprint = _footprint(engine, tmp_path)
        captured = []
        for _ in range(2):
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            assert run.stats is not None
            captured.append(run.stats["items"]["captured"])
        # the whole table once, then nothing: no row changed, none billed, no lake version
        assert captured == [200, 0]
        assert _footprint(engine, tmp_path) == footprint
        assert engine.committed_checkpoint("pg", "items") == {
            "cursor": 200,
            "trust": "a sequence the application only raises",
        }
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = 0, seen = 300 WHERE id = 7")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert (run.stats["items"]["captured"], run.stats["items"]["updates"]) == (1, 1)
        assert _rows(engine) == _source(pg_database)
    finally:
        engine.close()


def test_a_store_failing_the_positions_write_leaves_the_last_position_kept(
    tmp_path: Path, cdc_db, tools, s3_faults
) -> None:
    """An object store failing the write deleted the record it was to replace: the slot,
    confirmed at that record's position, then stood past where reads resumed (the
    commit's), and the next capture was refused until a new snapshot (needs_review)."""
    path = _project(tmp_path, cdc_db.dsn, CDC, cdc_db.prefix)
    path.write_text(path.read_text().replace("./lake", f"s3://{s3_faults.bucket}/lake"))
    slot = cdc_db.slot("public.items")
    for _ in range(2):
        assert tools.cli(tmp_path, "capture").returncode == 0
        with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO other SELECT generate_series(1, 100)")
    engine = Engine.open(path)
    try:
        kept = _lsn(engine)
        s3_faults.fail(
            {"method": "PUT", "contains": "_combined/positions", "status": 500, "times": -1}
        )
        failed = tools.cli(tmp_path, "capture")
        assert failed.returncode == 1 and "could not be written" in failed.stderr, failed.stderr
        assert s3_faults.faulted() > 0
        s3_faults.fail()
        assert _lsn(engine) == kept  # the last position kept, not the commit's
        confirmed = slot_status(Settings(cdc_db.dsn), slot).confirmed_flush_lsn
        assert confirmed is not None and confirmed <= kept
        again = tools.cli(tmp_path, "capture")
        assert again.returncode == 0, again.stderr
        assert _lsn(engine) > kept
    finally:
        engine.close()
