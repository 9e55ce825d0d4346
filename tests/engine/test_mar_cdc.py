"""MAR of a change stream: only a source row that changed is billed, a truncate's event none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.engine._binlog import Binlog
from tests.engine.test_cdc_capture import PROJECT

from combined.engine import Engine
from combined.runtime import _reduce


class _Clock(datetime):
    """The commits' acceptance time, ``months`` months of 31 days ahead of the clock."""

    months = 0

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz) + timedelta(days=31 * cls.months)


@pytest.fixture
def months(monkeypatch: pytest.MonkeyPatch) -> type[_Clock]:
    """Moves the month the next commits are billed in (``months.months += 1``)."""
    monkeypatch.setattr(_Clock, "months", 0)
    monkeypatch.setattr(_reduce, "datetime", _Clock)
    return _Clock


def _mar(engine: Engine, months: int = 0) -> tuple[int, int, int, int]:
    """(MAR, inserts, updates, deletes) of the month ``months`` months ahead."""
    month = f"{datetime.now(UTC) + timedelta(days=31 * months):%Y-%m}"
    rows = [u for u in engine.usage(month) if u["dataset"] == "items"]
    return next(((u["mar"], u["inserts"], u["updates"], u["deletes"]) for u in rows), (0,) * 4)


def _project(tmp_path: Path, cdc_db: Any, extra: str = "") -> Engine:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, body text)")
        conn.execute("ALTER TABLE items ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute(
            "INSERT INTO items SELECT g, g, repeat(md5(g::text), 100) FROM generate_series(1, 5) g"
        )
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


def test_a_truncate_of_an_event_stream_bills_no_row(
    tmp_path: Path, cdc_db: Any, months: type[_Clock]
) -> None:
    # An event stream keeps a truncate as an event whose columns are null:
    # it names no source row, so it is no active row (it billed one, every
    # truncate under the same id).
    engine = _project(tmp_path, cdc_db, "        sync_mode: append\n")
    try:
        _capture(engine, cdc_db.dsn)
        assert _mar(engine) == (5, 5, 0, 0)
        _capture(engine, cdc_db.dsn, "TRUNCATE items")
        _capture(engine, cdc_db.dsn, "INSERT INTO items VALUES (9, 9)", "TRUNCATE items")
        assert _mar(engine) == (6, 6, 0, 0)
        months.months += 1
        _capture(engine, cdc_db.dsn, "TRUNCATE items")
        ops = engine.sql("SELECT _combined_op AS op FROM pg.items").column("op").to_pylist()
        assert ops.count("truncate") == 3
        assert _mar(engine, 1) == (0, 0, 0, 0)
    finally:
        engine.close()


def test_a_stream_bills_only_the_rows_it_changed_in_each_month(
    tmp_path: Path, cdc_db: Any, months: type[_Clock]
) -> None:
    # Each step is a month of its own, so a row billed before would show.
    steps: list[tuple[tuple[str, ...], tuple[int, int, int, int]]] = [
        (("UPDATE items SET qty = qty",), (0, 0, 0, 0)),  # (body TOASTed: not sent)
        (
            ("UPDATE items SET qty = 7 WHERE id = 1", "UPDATE items SET qty = 1 WHERE id = 1"),
            (0,) * 4,
        ),
        (
            (
                "DELETE FROM items WHERE id = 2",
                "INSERT INTO items SELECT 2, 2, repeat(md5('2'), 100)",
            ),
            (0,) * 4,
        ),
        (("INSERT INTO items VALUES (20, 20)", "DELETE FROM items WHERE id = 20"), (0,) * 4),
        (("ALTER TABLE items ALTER COLUMN qty TYPE bigint",), (0,) * 4),
        (("ALTER TABLE items ADD COLUMN extra int",), (0,) * 4),
        (("UPDATE items SET id = 30 WHERE id = 3",), (2, 1, 0, 1)),  # a key change
        (("UPDATE items SET qty = 8 WHERE id = 4",), (1, 0, 1, 0)),
        # a keyed dataset applies a truncate as a delete of each row it held:
        # those rows are active (deleted), the truncate itself is none
        (("TRUNCATE items", "INSERT INTO items VALUES (9, 9)"), (6, 1, 0, 5)),
    ]
    engine = _project(tmp_path, cdc_db)
    try:
        _capture(engine, cdc_db.dsn)
        for statements, billed in steps:
            months.months += 1
            _capture(engine, cdc_db.dsn, *statements)
            assert (statements, _mar(engine, months.months)) == (statements, billed)
        assert _mar(engine) == (5, 5, 0, 0)  # the first month's as it was
    finally:
        engine.close()


def test_a_truncate_of_a_binlog_event_stream_bills_no_row(binlog: Binlog) -> None:
    binlog.project().write_text(binlog.project().read_text() + "        sync_mode: append\n")
    engine = Engine.open(binlog.root / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        before = _mar(engine)
        binlog.sql("TRUNCATE TABLE {t}")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        ops = engine.sql("SELECT _combined_op AS op FROM db.items").column("op").to_pylist()
        assert ops.count("truncate") == 1
        assert _mar(engine) == before
    finally:
        engine.close()
