"""The engine over a real PostgreSQL source: snapshot and cursor captures."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from combined.engine import Engine
from combined.errors import ConfigError

PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      orders:
        relation: public.orders
        key: [id]
      events:
        relation: public.events
        key: [id]
        strategy: cursor
        sync_mode: append
        cursor:
          column: id
          trust: "events.id is a bigserial assigned on insert"
"""


def test_snapshot_and_cursor_captures_from_postgres(tmp_path: Path, pg_database: str) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, qty int, note text, "
            "total numeric(12,2), placed_at timestamptz)"
        )
        conn.execute(
            "INSERT INTO orders SELECT g, g % 7, 'n' || g, g * 1.25, "
            "'2026-01-01'::timestamptz + g * interval '1 minute' FROM generate_series(1, 5000) g"
        )
        conn.execute("CREATE TABLE events (id bigserial PRIMARY KEY, kind text)")
        conn.execute("INSERT INTO events (kind) SELECT 'e' || g FROM generate_series(1, 100) g")
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=pg_database))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        total = engine.sql("SELECT sum(total) AS s, count(*) AS n FROM pg.orders").to_pylist()[0]
        assert total == {"s": Decimal("15628125.00"), "n": 5000}
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE orders SET note = 'changed' WHERE id <= 25")
            conn.execute("DELETE FROM orders WHERE id > 4990")
            conn.execute("INSERT INTO events (kind) VALUES ('late1'), ('late2')")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert run.stats["orders"]["updates"] == 25 and run.stats["orders"]["deletes"] == 10
        assert run.stats["events"]["captured"] == 2
        counts = engine.sql(
            "SELECT (SELECT count(*) FROM pg.orders) AS orders, "
            "(SELECT count(*) FROM pg.orders WHERE note = 'changed') AS changed, "
            "(SELECT count(*) FROM pg.events) AS events"
        ).to_pylist()[0]
        assert counts == {"orders": 4990, "changed": 25, "events": 102}
        receipt = engine.publications(1)[0]["member_rows"][0]["extraction_receipt"]
        assert receipt["snapshot_authority"] == "postgresql:pg_current_snapshot"
        assert receipt["extraction_completed_at"] is not None
        positions = {s["dataset"]: s["position"] for s in engine.status()}
        assert positions["pg.events"] == "102"
    finally:
        engine.close()


def test_a_numeric_wider_than_38_digits_is_captured_exactly_and_compared_by_value(
    tmp_path: Path, pg_database: str
) -> None:
    # Delta holds no decimal of more than 38 digits: the lake keeps the plain
    # text with the column's scale (never an exponent), and the identity
    # encodes the value, so an unchanged re-capture changes nothing.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id numeric(45,0) PRIMARY KEY, big numeric(50,10))")
        conn.execute(
            "INSERT INTO orders VALUES (123456789012345678901234567890123456789012345, "
            "12345678901234567890123456789.5), (2, 0.0000001), (3, NULL), (4, -5)"
        )
    (tmp_path / "combined.yaml").write_text(
        PROJECT.split("      events:")[0].format(dsn=pg_database)
    )
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT CAST(id AS VARCHAR) AS id, big FROM pg.orders ORDER BY big")
        assert rows.to_pylist() == [
            {"id": "4", "big": "-5.0000000000"},
            {"id": "2", "big": "0.0000001000"},
            {
                "id": "123456789012345678901234567890123456789012345",
                "big": "12345678901234567890123456789.5000000000",
            },
            {"id": "3", "big": None},
        ]
        (again,) = engine.capture()
        assert again.stats is not None and again.stats["orders"]["updates"] == 0
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE orders SET big = 0.00000010 WHERE id = 4")  # a new value
            conn.execute("UPDATE orders SET big = 0.00000010 WHERE id = 2")  # the same value
        (changed,) = engine.capture()
        assert changed.state == "succeeded", changed.error
        assert changed.stats is not None and changed.stats["orders"]["updates"] == 1
    finally:
        engine.close()


def test_numerics_with_a_negative_scale_or_a_scale_above_the_precision_are_captured_exactly(
    tmp_path: Path, pg_database: str
) -> None:
    # PostgreSQL 15 takes numeric(5, -2) (integers rounded to hundreds, up to
    # 7 digits) and numeric(3, 5) (five fractional digits, below 0.001). The
    # read typed them decimal128(5, -2) and decimal128(3, 5), which neither
    # the identity, DuckDB nor Delta holds: every capture failed at staging.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE orders (id numeric(5, -2) PRIMARY KEY, "
            "small numeric(3, 5), smalls numeric(3, 5)[], big numeric(37, -3))"
        )
        conn.execute(
            "INSERT INTO orders VALUES (9999900, 0.00999, ARRAY[-0.00001, NULL], "
            "9999999999999999999999999999999999999000), (-300, -0.00123, NULL, NULL), "
            "(0, NULL, '{}', -1000)"
        )
    (tmp_path / "combined.yaml").write_text(
        PROJECT.split("      events:")[0].format(dsn=pg_database)
    )
    # 40 digits: the lake keeps numeric(37, -3) as its plain text.
    query = "SELECT id, small, smalls, CAST(big AS {}) FROM {} ORDER BY id"
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(pg_database) as conn:
            source = [tuple(r) for r in conn.execute(query.format("text", "orders"))]
        lake = engine.sql(query.format("varchar", "pg.orders")).to_pylist()
        assert [tuple(r.values()) for r in lake] == source and len(lake) == 3
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE orders SET small = 0.00998 WHERE id = -300")
        (changed,) = engine.capture()
        assert changed.stats is not None and changed.stats["orders"]["updates"] == 1
        (again,) = engine.capture()
        assert again.stats is not None and again.stats["orders"]["updates"] == 0
    finally:
        engine.close()


def test_a_column_without_an_arrow_type_is_captured_through_a_declared_cast(
    tmp_path: Path, pg_database: str
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, spot point, price money)")
        conn.execute("INSERT INTO orders VALUES (1, '(1,2)', 12.5), (2, NULL, NULL)")
    project = tmp_path / "combined.yaml"
    project.write_text(PROJECT.split("      events:")[0].format(dsn=pg_database))
    engine = Engine.open(project)
    try:
        # Refused before any Run (test_preflight.py); the hint is what to write, where.
        with pytest.raises(ConfigError) as info:
            engine.capture()
        assert (
            'casts: {"public.orders.spot": "text", "public.orders.price": "text"} in the '
            "source configuration"
        ) in (info.value.hint or "")
        assert engine.runs() == []
    finally:
        engine.close()
    text = PROJECT.split("      events:")[0].format(dsn=pg_database)
    project.write_text(
        text.replace(
            "    datasets:",
            '      casts: {"public.orders.spot": text, "orders.price": "numeric(12,2)"}\n'
            "    datasets:",
        )
    )
    engine = Engine.open(project)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql("SELECT id, spot, price FROM pg.orders ORDER BY id").to_pylist()
        assert rows == [
            {"id": 1, "spot": "(1,2)", "price": Decimal("12.50")},
            {"id": 2, "spot": None, "price": None},
        ]
    finally:
        engine.close()


def test_a_widened_integer_column_evolves_the_table_and_keeps_every_row(
    tmp_path: Path, pg_database: str
) -> None:
    # int -> bigint -> numeric is a widening (policy: evolve by default) that
    # keeps every id and payload hash; Delta cannot widen a column in place,
    # and a value past the old type's range was refused on every capture.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, qty int, note text)")
        conn.execute("INSERT INTO orders SELECT g, g, 'n' || g FROM generate_series(1, 50) g")
    (tmp_path / "combined.yaml").write_text(
        PROJECT.split("      events:")[0].format(dsn=pg_database)
    )
    engine = Engine.open(tmp_path / "combined.yaml")

    def changes_after(*statements: str) -> tuple[int, int]:
        with psycopg.connect(pg_database, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        return run.stats["orders"]["inserts"], run.stats["orders"]["updates"]

    try:
        engine.capture()
        widened = changes_after(
            "ALTER TABLE orders ALTER COLUMN id TYPE bigint",
            "ALTER TABLE orders ALTER COLUMN qty TYPE bigint",
        )
        assert widened == (0, 0)
        big = changes_after(
            "UPDATE orders SET qty = 1099511627776 WHERE id = 1",
            "INSERT INTO orders VALUES (5000000000, 3, 'big')",
        )
        assert big == (1, 1)
        numeric = changes_after(
            "ALTER TABLE orders ALTER COLUMN qty TYPE numeric(30,0)",
            "UPDATE orders SET qty = 10::numeric ^ 25 WHERE id = 2",
        )
        assert numeric == (0, 1)
        rows = engine.sql(
            "SELECT count(*) AS n, sum(qty) AS total, max(id) AS top FROM pg.orders"
        ).to_pylist()
        assert rows == [
            {
                "n": 51,
                "total": Decimal(sum(range(3, 51)) + 1099511627776 + 10**25 + 3),
                "top": 5000000000,
            }
        ]
        assert len(engine.history("pg.orders")) == 3  # the widening alone changed no row
    finally:
        engine.close()


NULL_CURSOR_PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      items:
        relation: public.items
        key: [id]
        strategy: cursor
        cursor: {{column: updated_at, trust: "the application stamps every write"{nulls}}}
"""


def _null_cursor_items(dsn: str, tmp_path: Path, nulls: str | None) -> Engine:
    # 30 rows, every third one without an updated_at: a cursor window
    # (updated_at <= max) never reaches them, and control totals bounded the
    # same way counted 20 of 20, "reconciled", with 10 rows lost.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, updated_at timestamptz, v text)")
        conn.execute(
            "INSERT INTO items SELECT g, CASE WHEN g % 3 = 0 THEN NULL ELSE "
            "'2026-01-01'::timestamptz + g * interval '1 minute' END, 'v' || g "
            "FROM generate_series(1, 30) g"
        )
    setting = "" if nulls is None else f", nulls: {nulls}"
    (tmp_path / "combined.yaml").write_text(NULL_CURSOR_PROJECT.format(dsn=dsn, nulls=setting))
    return Engine.open(tmp_path / "combined.yaml")


def _control_rows(engine: Engine) -> int:
    from combined.catalog import data as cat

    with engine.catalog.begin() as conn:
        event = cat.activity(conn, kind="reconciliation.control", limit=1)[0]
    return int(event.body["control"]["rows"])


def test_a_null_cursor_fails_the_capture_by_default(tmp_path: Path, pg_database: str) -> None:
    engine = _null_cursor_items(pg_database, tmp_path, None)
    try:
        (run,) = engine.capture()
        assert run.state == "needs_review"
        assert "10 rows of 'public.items' hold null in cursor column 'updated_at'" in (
            run.error or ""
        )
        assert "cursor.nulls: include" in (run.error or "")
        assert "cursor.nulls: exclude" in (run.error or "")
        assert engine.publications(1) == []
        assert len(engine.run(run.id)["attempts"]) == 1  # not retried: a person decides
    finally:
        engine.close()


def test_null_cursor_rows_included_are_read_every_capture_and_reconciled(
    tmp_path: Path, pg_database: str
) -> None:
    engine = _null_cursor_items(pg_database, tmp_path, "include")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert run.stats["items"]["inserts"] == 30
        assert run.stats["items"]["reconciliation"] == "reconciled"
        assert _control_rows(engine) == 30
        nulls = "SELECT count(*) AS n FROM pg.items WHERE updated_at IS NULL"
        assert engine.sql(nulls).to_pylist() == [{"n": 10}]
        billed = engine.usage()
        versions = len(engine.history("pg.items"))
        # Read again, unchanged: nothing changes, nothing is billed.
        (again,) = engine.capture()
        assert again.state == "succeeded", again.error
        assert again.stats is not None
        assert again.stats["items"]["captured"] == 10  # only the NULL rows: no window moved
        assert (again.stats["items"]["inserts"], again.stats["items"]["updates"]) == (0, 0)
        assert again.stats["items"]["deliveries"] == 0
        assert again.stats["items"]["reconciliation"] == "reconciled"
        assert engine.usage() == billed
        assert len(engine.history("pg.items")) == versions
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE items SET v = 'changed' WHERE id = 3")  # still NULL
            conn.execute("UPDATE items SET updated_at = '2027-01-01' WHERE id = 6")
            conn.execute("INSERT INTO items VALUES (31, NULL, 'new')")
        (third,) = engine.capture()
        assert third.state == "succeeded", third.error
        assert third.stats is not None
        assert (third.stats["items"]["inserts"], third.stats["items"]["updates"]) == (1, 2)
        assert third.stats["items"]["reconciliation"] == "reconciled"
        rows = engine.sql(
            "SELECT id, v, updated_at IS NULL AS missing FROM pg.items WHERE id IN (3, 6, 31) "
            "ORDER BY id"
        ).to_pylist()
        assert rows == [
            {"id": 3, "v": "changed", "missing": True},
            {"id": 6, "v": "v6", "missing": False},
            {"id": 31, "v": "new", "missing": True},
        ]
    finally:
        engine.close()


def test_null_cursor_rows_excluded_are_left_out_and_not_counted(
    tmp_path: Path, pg_database: str
) -> None:
    engine = _null_cursor_items(pg_database, tmp_path, "exclude")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert run.stats["items"]["reconciliation"] == "reconciled"
        assert _control_rows(engine) == 20
        assert engine.sql("SELECT count(*) AS n FROM pg.items").to_pylist() == [{"n": 20}]
    finally:
        engine.close()


def test_a_capture_of_many_bare_named_tables_opens_a_connection_a_source_not_a_table(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each table was described again on a connection of its own, then read on another."""
    from combined.connectors.postgres import _connect

    names = [f"t{i}" for i in range(6)]
    with psycopg.connect(pg_database, autocommit=True) as conn:
        for name in names:
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 10) g")
    datasets = "".join(f"      {n}:\n        key: [id]\n" for n in names)
    project = "version: 1\nlake: ./lake\nsources:\n  pg:\n    connector: postgres\n"
    project += f"    config:\n      dsn: {pg_database}\n    datasets:\n{datasets}"
    (tmp_path / "combined.yaml").write_text(project)
    opened: list[int] = []
    connect = _connect.Session.__init__

    def counted(self: _connect.Session, settings: _connect.Settings) -> None:
        connect(self, settings)
        opened.append(self.pid)

    monkeypatch.setattr(_connect.Session, "__init__", counted)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        # One for the checks before the Run, one for the Run's discovery and reads.
        assert len(opened) == 2
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("ALTER TABLE t3 RENAME COLUMN v TO w")
        # The bare name is found in the discovery, whose column identities tell a
        # rename from a column dropped and another added.
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert "rename on field 'w' (was 'v')" in (run.error or "")
        (n,) = engine.sql("SELECT count(*) AS n FROM pg.t5").to_pylist()[0].values()
        assert n == 10
    finally:
        engine.close()
