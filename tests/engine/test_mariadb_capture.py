"""The engine over a real MariaDB source: a snapshot capture, then a re-capture's transition."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path

import pymysql
import pytest

from combined.connectors.mariadb._connect import Settings
from combined.engine import Engine

PROJECT = """\
version: 1
lake: ./lake
sources:
  shop:
    connector: mariadb
    config:
      dsn: {dsn}
      password: {{secret: "env:COMBINED_TEST_MARIADB_PASSWORD"}}
    datasets:
      orders:
        key: [id]
      events:
        key: [id]
        strategy: cursor
        sync_mode: append
        cursor:
          column: id
          trust: "events.id is auto_increment"
"""


def _sql(dsn: str, *statements: str) -> None:
    kwargs = Settings.from_config({"dsn": dsn}).connect_kwargs()
    kwargs.pop("conv")
    kwargs.pop("cursorclass")
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def test_snapshot_and_cursor_captures_from_mariadb(
    tmp_path: Path, mariadb_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    user, password = f"cap_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    database = mariadb_database.rsplit("/", 1)[1]
    _sql(
        mariadb_database,
        "CREATE TABLE orders (id BIGINT UNSIGNED PRIMARY KEY, qty INT, note VARCHAR(40),"
        " total DECIMAL(12,2), placed_at TIMESTAMP(6) NULL)",
        "INSERT INTO orders SELECT seq, seq % 7, CONCAT('n', seq), seq * 1.25,"
        " TIMESTAMP('2026-01-01') + INTERVAL seq MINUTE FROM seq_1_to_5000",
        "CREATE TABLE events (id INT AUTO_INCREMENT PRIMARY KEY, kind VARCHAR(10))",
        "INSERT INTO events (kind) SELECT CONCAT('e', seq) FROM seq_1_to_100",
    )
    _sql(
        mariadb_database,
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"GRANT SELECT ON `{database}`.* TO '{user}'@'%'",
    )
    host = mariadb_database.split("@", 1)[1]
    dsn = f"mysql://{user}@{host}"
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=dsn))
    # The password reaches the connector only through its secret reference.
    monkeypatch.setenv("COMBINED_TEST_MARIADB_PASSWORD", password)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        runs = engine.capture()
        assert all(run.state == "succeeded" for run in runs), [r.error for r in runs]
        total = engine.sql("SELECT sum(total) AS s, count(*) AS n FROM shop.orders").to_pylist()
        assert total[0] == {"s": Decimal("15628125.00"), "n": 5000}
        _sql(
            mariadb_database,
            "UPDATE orders SET note = 'changed' WHERE id <= 25",
            "DELETE FROM orders WHERE id > 4990",
            "INSERT INTO events (kind) VALUES ('late1'), ('late2')",
        )
        runs = engine.capture()
        assert all(run.state == "succeeded" for run in runs), [r.error for r in runs]
        stats = {k: v for run in runs for k, v in (run.stats or {}).items()}
        assert stats["orders"]["updates"] == 25 and stats["orders"]["deletes"] == 10
        assert stats["orders"]["inserts"] == 0
        assert stats["events"]["captured"] == 2
        counts = engine.sql(
            "SELECT (SELECT count(*) FROM shop.orders) AS orders, "
            "(SELECT count(*) FROM shop.orders WHERE note = 'changed') AS changed, "
            "(SELECT count(*) FROM shop.events) AS events"
        ).to_pylist()[0]
        assert counts == {"orders": 4990, "changed": 25, "events": 102}
        receipt = engine.publications(1)[0]["member_rows"][0]["extraction_receipt"]
        assert receipt["snapshot_authority"] == "mariadb:consistent_snapshot"
        positions = {s["dataset"]: s["position"] for s in engine.status()}
        # INSERT ... SELECT reserves auto_increment values in blocks: ask the source.
        kwargs = Settings.from_config({"dsn": mariadb_database}).connect_kwargs()
        kwargs.pop("cursorclass")
        with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
            cur.execute("SELECT MAX(id) FROM events")
            (top,) = cur.fetchone()
        assert positions["shop.events"] == top
        assert password not in (tmp_path / "combined.yaml").read_text()
    finally:
        engine.close()
        _sql(mariadb_database, f"DROP USER IF EXISTS '{user}'@'%'")
        # The database is the session's: later tests create tables of these names.
        _sql(mariadb_database, "DROP TABLE IF EXISTS orders, events")


NULL_CURSOR_PROJECT = """\
version: 1
lake: ./lake
sources:
  shop:
    connector: mariadb
    config:
      dsn: {dsn}
      zero_dates: "null"
    datasets:
      items:
        key: [id]
        strategy: cursor
        cursor: {{column: updated_at, trust: "ON UPDATE CURRENT_TIMESTAMP"{nulls}}}
"""


def _null_cursor_items(dsn: str, tmp_path: Path, nulls: str | None) -> Engine:
    # 12 rows: 6 dated, 3 zero dates (2, 6, 10), 3 NULLs (4, 8, 12). A zero
    # date is a value to the server (the lowest), read by the window and held
    # as null in the lake (zero_dates: null); only the NULLs are in no window.
    _sql(
        dsn,
        "SET SESSION sql_mode = ''",
        "CREATE TABLE items (id INT PRIMARY KEY, updated_at DATETIME(6) NULL, v VARCHAR(10))",
        "INSERT INTO items SELECT seq, CASE seq % 4 WHEN 0 THEN NULL"
        " WHEN 2 THEN '0000-00-00 00:00:00'"
        " ELSE TIMESTAMP('2026-01-01') + INTERVAL seq MINUTE END,"
        " CONCAT('v', seq) FROM seq_1_to_12",
    )
    setting = "" if nulls is None else f", nulls: {nulls}"
    (tmp_path / "combined.yaml").write_text(NULL_CURSOR_PROJECT.format(dsn=dsn, nulls=setting))
    return Engine.open(tmp_path / "combined.yaml")


def _control_rows(engine: Engine) -> int:
    from combined.catalog import data as cat

    with engine.catalog.begin() as conn:
        event = cat.activity(conn, kind="reconciliation.control", limit=1)[0]
    return int(event.body["control"]["rows"])


def test_a_null_cursor_fails_the_capture_by_default_and_zero_dates_are_not_nulls(
    tmp_path: Path, mariadb_database: str
) -> None:
    engine = _null_cursor_items(mariadb_database, tmp_path, None)
    try:
        (run,) = engine.capture()
        assert run.state == "needs_review"
        assert "3 rows of 'items' hold null in cursor column 'updated_at'" in (run.error or "")
        assert "cursor.nulls: include" in (run.error or "")
        assert len(engine.run(run.id)["attempts"]) == 1
        # Without NULLs, zero dates alone are values the window reads.
        _sql(mariadb_database, "DELETE FROM items WHERE updated_at IS NULL")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert engine.sql("SELECT count(*) AS n FROM shop.items").to_pylist() == [{"n": 9}]
    finally:
        engine.close()
        _sql(mariadb_database, "DROP TABLE items")


def test_null_cursor_rows_included_are_read_every_capture_and_reconciled(
    tmp_path: Path, mariadb_database: str
) -> None:
    engine = _null_cursor_items(mariadb_database, tmp_path, "include")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert run.stats["items"]["inserts"] == 12
        assert run.stats["items"]["reconciliation"] == "reconciled"
        assert _control_rows(engine) == 12
        nulls = "SELECT count(*) AS n FROM shop.items WHERE updated_at IS NULL"
        assert engine.sql(nulls).to_pylist() == [{"n": 6}]  # NULLs and zero dates
        billed = engine.usage()
        (again,) = engine.capture()
        assert again.state == "succeeded", again.error
        assert again.stats is not None
        assert again.stats["items"]["captured"] == 3  # the NULLs; zero dates lie below
        assert (again.stats["items"]["inserts"], again.stats["items"]["updates"]) == (0, 0)
        assert again.stats["items"]["reconciliation"] == "reconciled"
        assert engine.usage() == billed
        _sql(mariadb_database, "UPDATE items SET v = 'changed' WHERE id = 8")
        (third,) = engine.capture()
        assert third.stats is not None
        assert (third.stats["items"]["inserts"], third.stats["items"]["updates"]) == (0, 1)
        assert _control_rows(engine) == 12
    finally:
        engine.close()
        _sql(mariadb_database, "DROP TABLE items")


def test_null_cursor_rows_excluded_are_left_out_and_not_counted(
    tmp_path: Path, mariadb_database: str
) -> None:
    engine = _null_cursor_items(mariadb_database, tmp_path, "exclude")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert run.stats["items"]["reconciliation"] == "reconciled"
        assert _control_rows(engine) == 9
        assert engine.sql("SELECT count(*) AS n FROM shop.items").to_pylist() == [{"n": 9}]
    finally:
        engine.close()
        _sql(mariadb_database, "DROP TABLE items")


#: The source of NULL_CURSOR_PROJECT (zero_dates: null), its dataset keyed on a date.
ZERO_KEY_PROJECT = (
    NULL_CURSOR_PROJECT.split("    datasets:")[0] + "{casts}    datasets:\n      days:\n"
    "        key: [d]\n"
)


def test_zero_dates_read_as_null_in_a_key_name_the_cause_and_its_ways_out(
    tmp_path: Path, mariadb_database: str
) -> None:
    """Two zero dates of a key column, NULL under ``zero_dates: null``, repeat one key.

    The capture holds them in quarantine as any repeated key; its hint said
    "fix the key in the source", which holds no repeat. It names the zero
    dates, the setting, and a cast that keeps each its own key.
    """
    _sql(
        mariadb_database,
        "SET SESSION sql_mode = ''",
        "CREATE TABLE days (d DATE NOT NULL PRIMARY KEY, v INT)",
        "INSERT INTO days VALUES ('0000-00-00', 1), ('2020-00-05', 2), ('2021-01-01', 3)",
    )
    path = tmp_path / "combined.yaml"
    path.write_text(ZERO_KEY_PROJECT.format(dsn=mariadb_database, casts=""))
    engine = Engine.open(path)
    try:
        (run,) = engine.capture()
        assert run.state == "needs_review"
        error = run.error or ""
        assert "holds 1 duplicate key(s) of (d)" in error
        assert "key column 'd' holds zero dates, and zero_dates: null reads" in error
        assert "declare a key without zero dates" in error
        assert "set zero_dates: error" in error
        assert 'declare casts: {"days.d": "text"}' in error
        assert "fix the key in the source" not in error
    finally:
        engine.close()
    # The cast the hint names keeps each zero date as its own key.
    path.write_text(
        ZERO_KEY_PROJECT.format(dsn=mariadb_database, casts='      casts: {"days.d": text}\n')
    )
    engine = Engine.open(path)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        days = engine.sql("SELECT d FROM shop.days ORDER BY d").column("d").to_pylist()
        assert days == ["0000-00-00", "2020-00-05", "2021-01-01"]
    finally:
        engine.close()
        _sql(mariadb_database, "DROP TABLE days")
