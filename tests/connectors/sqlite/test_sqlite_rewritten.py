"""A rowid cursor over a table created again, or cut at the top, between reads."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from combined.connectors.abc import CursorSpec, ReadRequest
from combined.connectors.sqlite import SQLiteSource
from combined.errors import SchemaMismatch
from combined.protocol import RecordBatchMessage, StateMessage

AUTO = "CREATE TABLE ev (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT)"
PLAIN = "CREATE TABLE ev (id INTEGER PRIMARY KEY, body TEXT)"


def _exec(path: Path, *sql: str) -> None:
    with closing(sqlite3.connect(path)) as conn:
        for statement in sql:
            conn.execute(statement)
        conn.commit()


def _fill(path: Path, n: int) -> None:
    _exec(path, *(["INSERT INTO ev(body) VALUES ('x')"] * n))


def _read(path: Path, state: dict[str, object] | None) -> tuple[list[int], StateMessage]:
    request = ReadRequest(
        dataset="ev",
        relation="ev",
        key=("id",),
        strategy="cursor",
        cursor=CursorSpec("id", trust="rowid"),
        state=state,
    )
    extraction = SQLiteSource({"path": str(path)}).read(request)
    ids: list[int] = []
    final = None
    try:
        for message in extraction:
            if isinstance(message, RecordBatchMessage):
                ids += message.batch.column("id").to_pylist()
            else:
                final = message
    finally:
        extraction.finish("abort")
    assert isinstance(final, StateMessage)
    return ids, final


@pytest.mark.parametrize("create", [AUTO, PLAIN])
def test_a_table_created_again_below_the_checkpoint_is_refused_not_skipped(
    tmp_path: Path, create: str
) -> None:
    db = tmp_path / "src.db"
    _exec(db, create)
    _fill(db, 50)
    _, first = _read(db, None)
    _exec(db, "DROP TABLE ev", create)
    _fill(db, 3)  # ids 1..3, all at or below the checkpoint 50
    with pytest.raises(SchemaMismatch, match="created again") as info:
        _read(db, dict(first.state))
    assert info.value.context["next_id"] == 4
    assert "new dataset" in (info.value.hint or "")


def test_autoincrement_ids_past_deleted_rows_are_read_as_before(tmp_path: Path) -> None:
    db = tmp_path / "src.db"
    _exec(db, AUTO)
    _fill(db, 50)
    _, first = _read(db, None)
    _exec(db, "DELETE FROM ev WHERE id > 40")
    _fill(db, 2)  # ids 51 and 52: sqlite_sequence remembers 50
    ids, _ = _read(db, dict(first.state))
    assert ids == [51, 52]


def test_an_infinite_real_cursor_is_refused_not_made_a_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "src.db"
    _exec(db, "CREATE TABLE m (id INTEGER PRIMARY KEY, r REAL NOT NULL)")
    _exec(db, "INSERT INTO m VALUES (1, 1.5)", "INSERT INTO m VALUES (2, 9e999)")
    request = ReadRequest(
        dataset="m", relation="m", key=("id",), strategy="cursor", cursor=CursorSpec("r")
    )
    extraction = SQLiteSource({"path": str(db)}).read(request)
    try:
        with pytest.raises(SchemaMismatch, match="infinity"):
            list(extraction)
    finally:
        extraction.finish("abort")
