"""Soft deletes (issue 22, item 2): a row carrying its dataset's flag is projected as a delete.

``deletes: {flag: COLUMN}`` (a date/time: set means deleted; a boolean: true
means deleted) or ``{flag: COLUMN, value: V}``. The flagged row leaves the
projection and is billed as a delete; its Delivery keeps it as read, flag
included; a later row of the key without the flag inserts it again;
``explain`` shows the delete and ``replay`` rebuilds the same projection.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from combined import Engine

CURSOR_PROJECT = """\
version: 1
lake: ./lake
sources:
  app:
    connector: sqlite
    config:
      path: ./app.db
    datasets:
      accounts:
        key: [id]
        strategy: cursor
        cursor: {{column: updated_at, trust: "the application sets it on every write"}}
        deletes: {deletes}
"""


def _sqlite_app(root: Path, deletes: str = "{flag: deleted_at}") -> Path:
    con = sqlite3.connect(root / "app.db")
    con.executescript(
        """
        CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT, updated_at INTEGER,
                               deleted_at TIMESTAMP, status TEXT, tier INTEGER);
        INSERT INTO accounts VALUES (1, 'a', 1, NULL, 'live', 1), (2, 'b', 2, NULL, 'live', 1),
            (3, 'c', 3, NULL, 'live', 1), (4, 'd', 4, NULL, 'live', 1),
            (5, 'e', 5, '2026-11-01 09:00:00', 'deleted', 1);
        """
    )
    con.commit()
    con.close()
    path = root / "combined.yaml"
    path.write_text(CURSOR_PROJECT.format(deletes=deletes))
    return path


def _app_sql(root: Path, script: str) -> None:
    con = sqlite3.connect(root / "app.db")
    con.executescript(script)
    con.commit()
    con.close()


def _capture(engine: Engine) -> dict[str, Any]:
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    assert run.stats is not None
    stats: dict[str, Any] = next(iter(run.stats.values()))
    return stats


def _ids(engine: Engine, table: str) -> list[int]:
    return [r["id"] for r in engine.sql(f"SELECT id FROM {table} ORDER BY id").to_pylist()]


def _usage(engine: Engine, dataset: str) -> dict[str, Any]:
    (row,) = [u for u in engine.usage() if u["dataset"] == dataset]
    return {k: row[k] for k in ("mar", "inserts", "updates", "deletes")}


def _raw(root: Path, source: str, dataset: str) -> list[dict[str, Any]]:
    """Every row of the dataset's raw Deliveries, as delivered."""
    files = root / "lake" / "_deliveries" / source / dataset
    pattern = str(files / "**" / "*.parquet")
    con = duckdb.connect()
    try:
        table = con.sql(f"SELECT * FROM read_parquet('{pattern}', union_by_name = true)")
        rows: list[dict[str, Any]] = table.to_arrow_table().to_pylist()
    finally:
        con.close()
    return rows


def _replays_equal(engine: Engine, name: str) -> None:
    found = engine.replay(name)
    assert found.equal, found.differences
    assert found.replayed_rows == found.projection_rows


def test_cursor_capture_deletes_a_flagged_row_and_inserts_it_again_when_cleared(
    tmp_path: Path,
) -> None:
    engine = Engine.open(_sqlite_app(tmp_path))
    try:
        # A row deleted before its first capture never enters the projection.
        first = _capture(engine)
        assert (first["inserts"], first["deletes"]) == (4, 0)
        assert _ids(engine, "app.accounts") == [1, 2, 3, 4]
        _replays_equal(engine, "app.accounts")

        _app_sql(
            tmp_path,
            "UPDATE accounts SET deleted_at = '2026-11-30 10:00:00', updated_at = 10 "
            "WHERE id = 2; UPDATE accounts SET name = 'c2', updated_at = 11 WHERE id = 3",
        )
        second = _capture(engine)
        assert (second["inserts"], second["updates"], second["deletes"]) == (0, 1, 1)
        assert _ids(engine, "app.accounts") == [1, 3, 4]
        _replays_equal(engine, "app.accounts")
        gone = engine.explain("app.accounts", ["2"])
        assert gone.status == "deleted"
        assert "soft-delete flag deleted_at = 2026-11-30 10:00:00" in gone.reason
        assert gone.versions[-1].op == "delete"
        assert gone.versions[-1].values["deleted_at"] == "2026-11-30 10:00:00"

        # Cleared: the key comes back as an insert.
        _app_sql(tmp_path, "UPDATE accounts SET deleted_at = NULL, updated_at = 12 WHERE id = 2")
        third = _capture(engine)
        assert (third["inserts"], third["updates"], third["deletes"]) == (1, 0, 0)
        assert _ids(engine, "app.accounts") == [1, 2, 3, 4]
        row = engine.sql("SELECT name, deleted_at FROM app.accounts WHERE id = 2").to_pylist()
        assert row == [{"name": "b", "deleted_at": None}]
        _replays_equal(engine, "app.accounts")
        back = engine.explain("app.accounts", ["2"])
        assert back.status == "present"
        assert [v.op for v in back.versions] == ["snapshot", "delete", "insert"]
        assert [v.soft_delete for v in back.versions] == [
            None,
            "deleted_at = 2026-11-30 10:00:00",
            None,
        ]

        # MAR bills the soft delete as a delete (and id 2's return as the
        # insert it was billed for already this month).
        assert _usage(engine, "accounts") == {"mar": 4, "inserts": 4, "updates": 1, "deletes": 1}
    finally:
        engine.close()

    # The raw layer keeps the flagged row as read, flag included, as a delete.
    raw = _raw(tmp_path, "app", "accounts")
    deleted = [r for r in raw if r["_combined_op"] == "delete"]
    assert [(r["id"], r["name"], r["deleted_at"]) for r in deleted] == [
        (2, "b", "2026-11-30 10:00:00")
    ]


def test_a_flag_equal_to_a_value_marks_deletes(tmp_path: Path, tools: Any) -> None:
    engine = Engine.open(_sqlite_app(tmp_path, "{flag: status, value: deleted}"))
    try:
        _capture(engine)
        assert _ids(engine, "app.accounts") == [1, 2, 3, 4]
        _app_sql(tmp_path, "UPDATE accounts SET status = 'deleted', updated_at = 10 WHERE id = 4")
        assert _capture(engine)["deletes"] == 1
        assert _ids(engine, "app.accounts") == [1, 2, 3]
        _replays_equal(engine, "app.accounts")
    finally:
        engine.close()
    shown = tools.cli(tmp_path, "explain", "app.accounts", "4", env={"COLUMNS": "300"})
    assert shown.returncode == 0, shown.stderr
    assert "deleted (soft-delete flag status = deleted) by run" in shown.stdout
    assert "2. delete (soft-delete flag status = deleted)  run" in shown.stdout


SNAPSHOT_PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      users:
        relation: public.users
        key: [id]
        deletes: {{flag: is_deleted}}
"""


def test_snapshot_with_a_boolean_flag(tmp_path: Path, pg_database: str) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE users (id bigint PRIMARY KEY, name text, is_deleted boolean)")
        conn.execute(
            "INSERT INTO users VALUES (1, 'a', false), (2, 'b', NULL), (3, 'c', true), "
            "(4, 'd', false)"
        )
    (tmp_path / "combined.yaml").write_text(SNAPSHOT_PROJECT.format(dsn=pg_database))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        # NULL and false are live; true is deleted. The source's count, less
        # its flagged rows, reconciles with the lake's (control totals included).
        first = _capture(engine)
        assert (first["inserts"], first["reconciliation"]) == (3, "reconciled")
        assert _ids(engine, "pg.users") == [1, 2, 4]

        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE users SET is_deleted = true WHERE id = 1")
        stats = _capture(engine)
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (0, 0, 1)
        assert stats["reconciliation"] == "reconciled"
        assert _ids(engine, "pg.users") == [2, 4]
        # Still flagged next time: nothing changes, nothing is billed again.
        again = _capture(engine)
        assert (again["inserts"], again["updates"], again["deletes"]) == (0, 0, 0)
        _replays_equal(engine, "pg.users")

        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE users SET is_deleted = false WHERE id IN (1, 3)")
        assert _capture(engine)["inserts"] == 2
        assert _ids(engine, "pg.users") == [1, 2, 3, 4]
        _replays_equal(engine, "pg.users")
        assert _usage(engine, "users") == {"mar": 4, "inserts": 4, "updates": 0, "deletes": 1}
        back = engine.explain("pg.users", ["1"])
        assert [(v.op, v.soft_delete) for v in back.versions] == [
            ("snapshot", None),
            ("delete", "is_deleted = True"),
            ("insert", None),
        ]

        (plan,) = engine.plan(["pg"])
        claims = [c.text for s in plan.sections if s.title == "Deletes" for c in s.claims]
        assert any(
            c.startswith("users: soft-delete flag is_deleted (true or set means deleted)")
            for c in claims
        ), claims
    finally:
        engine.close()
    flagged = [r for r in _raw(tmp_path, "pg", "users") if r["_combined_op"] == "delete"]
    assert [(r["id"], r["is_deleted"]) for r in flagged] == [(1, True)]


LEDGER_PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      ledger:
        relation: public.ledger
        key: [id]
        control_sum: amount
        deletes: {{flag: deleted_at}}
"""


def test_control_totals_and_a_backfill_reconcile_without_the_flagged_rows(
    tmp_path: Path, pg_database: str
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE ledger (id bigint PRIMARY KEY, amount numeric(12,2), "
            "deleted_at timestamptz)"
        )
        conn.execute(
            "INSERT INTO ledger SELECT g, g * 1.25, CASE WHEN g % 10 = 0 THEN now() END "
            "FROM generate_series(1, 100) g"
        )
    (tmp_path / "combined.yaml").write_text(LEDGER_PROJECT.format(dsn=pg_database))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        first = _capture(engine)
        assert (first["inserts"], first["reconciliation"]) == (90, "reconciled")
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE ledger SET deleted_at = now() WHERE id IN (11, 12, 61)")
        # A bounded read over the key: its control totals (rows and the sum)
        # count the range's flagged rows, which never land.
        run = engine.backfill("pg.ledger", partitions=2, lower="1", upper="51")
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        stats = run.stats["ledger"]
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (0, 0, 2)
        assert len(_ids(engine, "pg.ledger")) == 88  # 61 waits for a read that reaches it
        _replays_equal(engine, "pg.ledger")
    finally:
        engine.close()


CDC_PROJECT = """\
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
        strategy: cdc
        deletes: {{flag: deleted_at}}
"""


def test_cdc_update_setting_the_flag_is_a_delete(tmp_path: Path, cdc_db: Any) -> None:
    dsn = cdc_db.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, deleted_at timestamptz)")
        conn.execute(
            "INSERT INTO items SELECT g, g, CASE WHEN g = 5 THEN now() END "
            "FROM generate_series(1, 6) g"
        )
    cdc_db.slot("public.items")
    (tmp_path / "combined.yaml").write_text(CDC_PROJECT.format(dsn=dsn, prefix=cdc_db.prefix))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _capture(engine)
        assert _ids(engine, "pg.items") == [1, 2, 3, 4, 6]

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET deleted_at = now() WHERE id = 2")
            conn.execute("UPDATE items SET qty = 30 WHERE id = 3")
            conn.execute("DELETE FROM items WHERE id = 4")
        stats = _capture(engine)
        assert (stats["updates"], stats["deletes"]) == (1, 2)
        assert _ids(engine, "pg.items") == [1, 3, 6]
        _replays_equal(engine, "pg.items")

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET deleted_at = NULL, qty = 20 WHERE id = 2")
            # Set and cleared within the capture: the last change wins.
            conn.execute("UPDATE items SET deleted_at = now() WHERE id = 6")
            conn.execute("UPDATE items SET deleted_at = NULL WHERE id = 6")
        stats = _capture(engine)
        assert (stats["inserts"], stats["deletes"]) == (1, 0)
        rows = engine.sql("SELECT id, qty FROM pg.items ORDER BY id").to_pylist()
        assert [(r["id"], r["qty"]) for r in rows] == [(1, 1), (2, 20), (3, 30), (6, 6)]
        _replays_equal(engine, "pg.items")
        assert _usage(engine, "items")["deletes"] == 2
        # A hard delete is no soft one; an UPDATE setting the flag is.
        gone = engine.explain("pg.items", ["4"])
        assert gone.status == "deleted" and gone.versions[-1].soft_delete is None
        flagged_then_back = engine.explain("pg.items", ["2"])
        ops = [v.op for v in flagged_then_back.versions]
        assert ops == ["snapshot", "delete", "insert"]
        assert str(flagged_then_back.versions[1].soft_delete).startswith("deleted_at = 2")
    finally:
        engine.close()
    flagged = [r for r in _raw(tmp_path, "pg", "items") if r["_combined_op"] == "delete"]
    assert sorted((r["id"], r["deleted_at"] is not None) for r in flagged) == [
        (2, True),
        (4, False),
    ]


# -- configuration errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deletes", "said"),
    [
        ("{flag: deleted_on}", "soft-delete flag 'deleted_on' is not a column"),
        ("{flag: tier}", "soft-delete flag 'tier' has type INTEGER (int64)"),
        ("{flag: status}", "soft-delete flag 'status' has type TEXT (string)"),
        ("{flag: deleted_at, value: 1}", "`value: 1` is an integer"),
    ],
)
def test_check_and_capture_refuse_a_flag_the_relation_cannot_hold(
    tmp_path: Path, tools: Any, deletes: str, said: str
) -> None:
    _sqlite_app(tmp_path, deletes)
    for command in ("check", "capture"):
        result = tools.cli(tmp_path, command)
        assert result.returncode == 2, result.stdout + result.stderr
        told = " ".join((result.stdout + result.stderr).split())
        assert said in told, told
        assert "deletes: {flag:" in told  # the fix is named
    assert not (tmp_path / "lake" / "app").exists()


@pytest.mark.parametrize(
    ("dataset", "said"),
    [
        (
            "relation: accounts\n        deletes: {flag: deleted_at}",
            "key is required when sync_mode is incremental",
        ),
        (
            "key: [id]\n        sync_mode: append\n        deletes: {flag: deleted_at}",
            "needs sync_mode incremental, not append",
        ),
        (
            "key: [id]\n        sync_mode: full_refresh\n        deletes: {flag: deleted_at}",
            "needs sync_mode incremental, not full_refresh",
        ),
        (
            "key: [id]\n        columns: [id, name]\n        deletes: {flag: deleted_at}",
            "leaves out 'deleted_at'",
        ),
    ],
)
def test_a_flag_needs_a_keyed_incremental_dataset(
    tmp_path: Path, tools: Any, dataset: str, said: str
) -> None:
    _sqlite_app(tmp_path)
    project = tmp_path / "combined.yaml"
    project.write_text(
        "version: 1\nlake: ./lake\nsources:\n  app:\n    connector: sqlite\n"
        f"    config:\n      path: ./app.db\n    datasets:\n      accounts:\n        {dataset}\n"
    )
    result = tools.cli(tmp_path, "check")
    assert result.returncode == 2, result.stdout + result.stderr
    told = " ".join((result.stdout + result.stderr).split())
    assert said in told, told
    # Declared as the error says, the flag is taken.
    fixed = "key: [id]\n        deletes: {flag: deleted_at}"
    project.write_text(project.read_text().replace(dataset, fixed))
    result = tools.cli(tmp_path, "check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_soft_delete_closes_the_rows_history_version(tmp_path: Path) -> None:
    """``history: true`` beside ``deletes:``: a flagged row ends its current
    version (as a hard delete does) rather than adding a "deleted" version."""
    path = _sqlite_app(tmp_path)
    path.write_text(path.read_text() + "        history: true\n")
    engine = Engine.open(path)
    try:
        _capture(engine)
        _app_sql(
            tmp_path,
            "UPDATE accounts SET deleted_at = '2026-11-02 10:00:00', updated_at = 10 WHERE id = 2",
        )
        _capture(engine)
        rows = engine.sql(
            "SELECT id, _combined_is_current AS cur, _combined_valid_to IS NULL AS open "
            "FROM app.accounts__history ORDER BY id, _combined_valid_from"
        ).to_pylist()
    finally:
        engine.close()
    two = [r for r in rows if r["id"] == 2]
    assert two == [{"id": 2, "cur": False, "open": False}], rows
    assert all(r["cur"] and r["open"] for r in rows if r["id"] != 2)
    assert sorted({r["id"] for r in rows}) == [1, 2, 3, 4]
