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
