"""Discovery and check of the SQLite connector against real database files."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from combined.connectors import connector_class
from combined.connectors.abc import DatasetDiscovery
from combined.connectors.sqlite import SQLiteSource
from combined.errors import ConfigError, SourceError, SourceUnavailable

SCHEMA = '''
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    email TEXT NOT NULL UNIQUE,
    nickname TEXT UNIQUE,
    seq INT NOT NULL,
    code TEXT NOT NULL,
    updated_at TEXT,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    amount DECIMAL(10, 2),
    ratio REAL,
    payload BLOB,
    active BOOLEAN,
    born DATE
);
CREATE INDEX orders_seq ON orders (seq);
CREATE UNIQUE INDEX orders_code_part ON orders (code) WHERE seq > 0;
CREATE UNIQUE INDEX orders_lower_email ON orders (lower(email));
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT);
CREATE TABLE lines (
    order_id INT NOT NULL,
    line_no INT NOT NULL,
    sku TEXT,
    PRIMARY KEY (order_id, line_no)
) WITHOUT ROWID;
CREATE TABLE reversed (id INTEGER PRIMARY KEY DESC, v TEXT);
CREATE TABLE "odd ""name""" ("select" TEXT NOT NULL, "from" INT);
CREATE VIEW big_orders AS
    SELECT id, email, amount * 2 AS doubled, CAST(seq AS INTEGER) AS seq FROM orders;
'''


def make_db(path: Path, script: str = SCHEMA) -> Path:
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(script)
        conn.executemany(
            "INSERT INTO orders (email, seq, code) VALUES (?, ?, ?)",
            [(f"u{i}@x", i, f"c{i}") for i in range(3)],
        )
        conn.commit()
    return path


@pytest.fixture
def source(tmp_path: Path) -> SQLiteSource:
    return SQLiteSource({"path": str(make_db(tmp_path / "shop.db"))})


def dataset(source: SQLiteSource, name: str) -> DatasetDiscovery:
    found = source.discover().dataset(name)
    assert found is not None, name
    return found


def test_discover_lists_tables_and_views_with_their_kind(source: SQLiteSource) -> None:
    discovery = source.discover()
    kinds = {d.name: d.kind for d in discovery.datasets}
    assert kinds == {
        "orders": "table",
        "events": "table",
        "lines": "table",
        "reversed": "table",
        'odd "name"': "table",
        "big_orders": "view",
    }
    assert discovery.connector == "sqlite"
    assert discovery.revision == "1"


def test_fields_carry_arrow_and_declared_types(source: SQLiteSource) -> None:
    fields = {f.name: f for f in dataset(source, "orders").fields}
    assert [(n, f.arrow_type, f.source_type) for n, f in fields.items()] == [
        ("id", "int64", "INTEGER"),
        ("email", "string", "TEXT"),
        ("nickname", "string", "TEXT"),
        ("seq", "int64", "INT"),
        ("code", "string", "TEXT"),
        ("updated_at", "string", "TEXT"),
        ("created_at", "string", "TEXT"),
        ("amount", "string", "DECIMAL(10, 2)"),
        ("ratio", "double", "REAL"),
        ("payload", "binary", "BLOB"),
        ("active", "bool", "BOOLEAN"),
        ("born", "string", "DATE"),
    ]
    # A rowid alias can never be NULL, even though SQLite reports no NOT NULL.
    assert not fields["id"].nullable
    assert not fields["email"].nullable
    assert fields["nickname"].nullable


def test_primary_and_unique_keys_are_only_what_the_catalog_proves(source: SQLiteSource) -> None:
    orders = dataset(source, "orders")
    assert orders.primary_key == ("id",)
    # email: NOT NULL + UNIQUE proves a key. nickname is UNIQUE but nullable
    # (SQLite allows many NULLs), code's unique index is partial, and
    # lower(email) is an expression: none of them proves a key of columns.
    assert orders.unique_keys == (("email",),)
    assert orders.estimated_rows == 3


def test_without_rowid_composite_key(source: SQLiteSource) -> None:
    lines = dataset(source, "lines")
    assert lines.primary_key == ("order_id", "line_no")
    assert {f.name: f.nullable for f in lines.fields} == {
        "order_id": False,
        "line_no": False,
        "sku": True,
    }


def test_cursor_candidates_carry_evidence(source: SQLiteSource) -> None:
    candidates = {c.column: c.evidence for c in dataset(source, "orders").cursor_candidates}
    # Without AUTOINCREMENT a new row takes max(rowid) + 1: once the largest
    # rows are deleted their ids come back, at or below a cursor's checkpoint.
    assert candidates["id"].startswith("integer primary key: rowid alias")
    assert "reuse the ids of deleted rows" in candidates["id"]
    assert "never reads them" in candidates["id"]
    assert "leads index 'orders_seq'" in candidates["seq"]
    assert "does not prove that values only grow" in candidates["seq"]
    assert "defaults to current_timestamp on insert" in candidates["created_at"]
    # Never guessed from a name: updated_at is nullable and not indexed.
    assert "updated_at" not in candidates
    assert "nickname" not in candidates  # nullable
    assert "payload" not in candidates


def test_autoincrement_evidence_is_stronger(source: SQLiteSource) -> None:
    (candidate,) = dataset(source, "events").cursor_candidates
    assert candidate.column == "id"
    assert "autoincrement" in candidate.evidence
    assert "larger than any the table ever held" in candidate.evidence


def test_integer_primary_key_desc_is_not_a_rowid_alias(source: SQLiteSource) -> None:
    reversed_ = dataset(source, "reversed")
    assert reversed_.primary_key == ("id",)
    assert all("rowid alias" not in c.evidence for c in reversed_.cursor_candidates)
    assert {f.name: f.nullable for f in reversed_.fields}["id"] is True


def test_views_report_fields_but_no_keys(source: SQLiteSource) -> None:
    view = dataset(source, "big_orders")
    assert view.kind == "view"
    assert view.primary_key == ()
    assert view.unique_keys == ()
    assert view.cursor_candidates == ()
    assert view.estimated_rows is None
    types = {f.name: (f.arrow_type, f.source_type) for f in view.fields}
    assert types["id"] == ("int64", "INTEGER")
    assert types["doubled"] == ("string", "")  # an expression has no declared type
    assert types["seq"] == ("int64", "INT")


def test_quoted_names_are_discovered(source: SQLiteSource) -> None:
    odd = dataset(source, 'odd "name"')
    assert [f.name for f in odd.fields] == ["select", "from"]


def test_check_accepts_a_database(source: SQLiteSource) -> None:
    source.check()


def test_check_missing_file_is_unavailable_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    with pytest.raises(SourceUnavailable) as caught:
        SQLiteSource({"path": str(path)}).check()
    assert str(path) in caught.value.message
    assert caught.value.context["path"] == str(path)
    assert caught.value.hint
    assert not path.exists()


def test_check_not_a_database_is_a_source_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"this is plain text, not a sqlite file\n" * 200)
    with pytest.raises(SourceError) as caught:
        SQLiteSource({"path": str(path)}).check()
    assert not isinstance(caught.value, SourceUnavailable)  # retrying will not help
    assert "not a sqlite database" in caught.value.message


def test_check_directory_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="directory"):
        SQLiteSource({"path": str(tmp_path)}).check()


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"path": ""},
        {"path": 3},
        {"path": "x.db", "batch_rows": 0},
        {"path": "x", "batch_rows": "9"},
    ],
)
def test_invalid_configuration_is_refused(config: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        SQLiteSource(config)


def test_registered_under_its_name() -> None:
    assert connector_class("sqlite") is SQLiteSource
    assert SQLiteSource.SUPPORTS_SNAPSHOT and SQLiteSource.SUPPORTS_CURSOR
    assert not SQLiteSource.SUPPORTS_CDC
