"""MAR of a PostgreSQL change stream: only a source row that changed is billed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from tests.engine.test_cdc_capture import PROJECT

from combined.engine import Engine


def _mar(engine: Engine) -> dict[str, Any]:
    (row,) = [u for u in engine.usage() if u["dataset"] == "items"]
    return {k: row[k] for k in ("mar", "inserts", "updates", "deletes")}


def _project(tmp_path: Path, cdc_db: Any, extra: str = "") -> Engine:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int)")
        conn.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 5) g")
    project = PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, table="items")
    (tmp_path / "combined.yaml").write_text(project + extra)
    return Engine.open(tmp_path / "combined.yaml")


def _capture(engine: Engine, dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error


def test_a_lone_truncate_of_an_event_stream_makes_a_version_that_counts_it(
    tmp_path: Path, cdc_db: Any
) -> None:
    # The truncate event changes no identity: the dataset kept its version,
    # whose row count lacked the event the lake now held (needs_review).
    engine = _project(tmp_path, cdc_db, "        sync_mode: append\n")
    try:
        _capture(engine, cdc_db.dsn)
        _capture(engine, cdc_db.dsn, "TRUNCATE items")
        (count,) = engine.sql("SELECT count(*) AS n FROM pg.items").column("n").to_pylist()
        assert count == 6
    finally:
        engine.close()


def test_a_truncate_of_an_event_stream_bills_no_row(tmp_path: Path, cdc_db: Any) -> None:
    # An event stream keeps a truncate as an event whose columns are null:
    # it names no source row, so it is no active row (it billed one).
    engine = _project(tmp_path, cdc_db, "        sync_mode: append\n")
    try:
        _capture(engine, cdc_db.dsn)
        assert _mar(engine) == {"mar": 5, "inserts": 5, "updates": 0, "deletes": 0}
        _capture(engine, cdc_db.dsn, "TRUNCATE items")
        _capture(engine, cdc_db.dsn, "INSERT INTO items VALUES (9, 9)", "TRUNCATE items")
        ops = engine.sql("SELECT _combined_op AS op FROM pg.items").column("op").to_pylist()
        assert ops.count("truncate") == 2
        assert _mar(engine) == {"mar": 6, "inserts": 6, "updates": 0, "deletes": 0}
    finally:
        engine.close()


def test_a_truncate_of_a_keyed_table_bills_each_row_it_removes(tmp_path: Path, cdc_db: Any) -> None:
    # A keyed dataset applies a truncate as a delete of each row it held:
    # those rows are active (deleted), the truncate itself is none.
    engine = _project(tmp_path, cdc_db)
    try:
        _capture(engine, cdc_db.dsn)
        _capture(engine, cdc_db.dsn, "TRUNCATE items", "INSERT INTO items VALUES (9, 9)")
        assert _mar(engine) == {"mar": 6, "inserts": 6, "updates": 0, "deletes": 5}
    finally:
        engine.close()
