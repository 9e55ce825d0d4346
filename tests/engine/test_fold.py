"""A snapshot re-capture the source's statistics call unchanged, confirmed by the rows' fold.

The capture stages its rows without hashing them and folds them
(``runtime._fold``); equal to the fold the lake's newest commit recorded,
nothing changed and no row was hashed. A change the statistics did not
show (here: written with ``track_counts`` off) is found by the fold, and
the capture hashes and reduces as any other.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import deltalake
import psycopg

from combined.engine import Engine

PROJECT = """\
version: 1
lake: ./lake
catalog: sqlite:///.combined/catalog.db
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      items:
        key: [id]
"""

ROWS = """
CREATE TABLE items (
  id bigint PRIMARY KEY, qty int, name text, price numeric(12, 2), seen_at timestamptz,
  doc jsonb, tags text[], raw bytea, ref uuid, day date, ok boolean, ratio float8
);
INSERT INTO items
SELECT i, i % 7, 'item ' || i, i * 1.25, timestamptz '2026-01-01' + i * interval '1 minute',
       jsonb_build_object('i', i), ARRAY['t' || i, NULL], decode(md5(i::text), 'hex'),
       md5(i::text)::uuid, date '2026-01-01' + i, i % 2 = 0, i / 3.0
FROM generate_series(1, 3000) AS i;
"""
COLUMNS = "id, qty, name, price, seen_at, doc, tags, raw, ref, day, ok, ratio"


def _open(root: Path, dsn: str) -> Engine:
    _write(dsn, ROWS)
    (root / "combined.yaml").write_text(PROJECT.format(dsn=dsn))
    return Engine.open(root / "combined.yaml")


def _write(dsn: str, *statements: str, counted: bool = True) -> None:
    """Run ``statements``; with ``counted`` False, unseen by the table's statistics."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not counted:
            conn.execute("SET track_counts = off")
        for statement in statements:
            conn.execute(statement)
    # The server's statistics hold a session's writes once it ended (the
    # backend reports them as it exits, a moment after the client closed).
    time.sleep(1.0)


def _capture(engine: Engine, dataset: str = "items") -> dict[str, Any]:
    """One capture of the project's one dataset; its stats."""
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    assert run.stats is not None
    stats: dict[str, Any] = run.stats[dataset]
    return stats


def _source(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        texts = COLUMNS.replace("doc", "doc::text").replace("ref", "ref::text")
        query = f"SELECT {texts} FROM items ORDER BY id"
        return [tuple(r) for r in conn.execute(query).fetchall()]


def _lake(engine: Engine) -> list[tuple[Any, ...]]:
    rows = engine.sql(f"SELECT {COLUMNS} FROM pg.items ORDER BY id").to_pylist()
    return [tuple(r.values()) for r in rows]


def _commits(root: Path) -> list[dict[str, Any]]:
    """The Combined metadata of the items table's commits, newest first."""
    return _commits_of(root, "pg", "items")


def _commits_of(root: Path, source: str, dataset: str) -> list[dict[str, Any]]:
    """The Combined metadata of a table's commits, newest first."""
    table = deltalake.DeltaTable(str(root / "lake" / source / dataset))
    return [
        json.loads(entry["combined"]) if isinstance(entry["combined"], str) else entry["combined"]
        for entry in table.history()
        if "combined" in entry
    ]


def test_an_unchanged_table_is_confirmed_by_its_fold_without_hashing(
    tmp_path: Path, pg_database: str
) -> None:
    engine = _open(tmp_path, pg_database)
    try:
        first = _capture(engine)
        assert first["inserts"] == 3000 and "fold" not in first
        (commit,) = _commits(tmp_path)
        fold = commit["capture_fold"]
        assert fold["rows"] == 3000 and fold["marker"].startswith("pg2:")
        again = _capture(engine)
        assert again["fold"] == "same"
        assert (again["inserts"], again["updates"], again["deletes"]) == (0, 0, 0)
        assert again["deliveries"] == 0 and again["reconciliation"] == "reconciled"
        assert len(_commits(tmp_path)) == 1  # nothing committed
        assert _lake(engine) == _source(pg_database)
    finally:
        engine.close()


def test_a_change_the_statistics_do_not_show_is_found_by_the_fold(
    tmp_path: Path, pg_database: str
) -> None:
    engine = _open(tmp_path, pg_database)
    try:
        _capture(engine)
        _write(
            pg_database,
            "UPDATE items SET name = 'renamed' WHERE id = 17",
            "UPDATE items SET tags = ARRAY[NULL, 't18'] WHERE id = 18",
            "DELETE FROM items WHERE id = 19",
            "INSERT INTO items (id, qty) VALUES (5000, 1)",
            counted=False,
        )
        changed = _capture(engine)
        assert changed["fold"] == "differed"
        assert (changed["inserts"], changed["updates"], changed["deletes"]) == (1, 2, 1)
        assert _lake(engine) == _source(pg_database)
        # The commit records the new rows' fold: the next capture confirms them.
        assert _commits(tmp_path)[0]["capture_fold"]["rows"] == 3000
        assert _capture(engine)["fold"] == "same"
    finally:
        engine.close()


def test_rows_moved_between_keys_unseen_by_the_statistics_are_found(
    tmp_path: Path, pg_database: str
) -> None:
    """Two rows swap their payloads: the same values, at other keys."""
    engine = _open(tmp_path, pg_database)
    try:
        _capture(engine)
        _write(
            pg_database,
            "UPDATE items SET qty = CASE id WHEN 1 THEN 2 ELSE 1 END WHERE id IN (1, 2)",
            counted=False,
        )
        changed = _capture(engine)
        assert changed["fold"] == "differed" and changed["updates"] == 2
        assert _lake(engine) == _source(pg_database)
    finally:
        engine.close()


def test_a_commit_of_another_writer_sets_the_fold_aside_but_combineds_compaction_does_not(
    tmp_path: Path, pg_database: str
) -> None:
    """After the commit that recorded the fold, only Combined's compactions keep it.

    Another writer's commit (a compaction here, which changes no row: any
    commit is treated alike) may have changed rows, so the capture is
    hashed and compared row by row.
    """
    engine = _open(tmp_path, pg_database)
    try:
        _capture(engine)
        _write(pg_database, "INSERT INTO items (id) VALUES (4000)")
        _capture(engine)  # a second file
        table = deltalake.DeltaTable(str(tmp_path / "lake" / "pg" / "items"))
        table.optimize.compact()
        again = _capture(engine)
        assert "fold" not in again  # hashed as it read, and compared with the lake
        assert (again["inserts"], again["updates"], again["deletes"]) == (0, 0, 0)
        _write(pg_database, "INSERT INTO items (id) VALUES (4001)")
        _capture(engine)
        _write(pg_database, "INSERT INTO items (id) VALUES (4002)")
        _capture(engine)
        reports = engine.maintain()
        assert [r for r in reports if r.get("dataset") == "pg.items"][0]["compacted"] > 0
        assert _capture(engine)["fold"] == "same"
        assert _lake(engine) == _source(pg_database)
    finally:
        engine.close()


def test_a_capture_that_changed_nothing_keeps_its_fold_for_the_next(
    tmp_path: Path, pg_database: str
) -> None:
    """Writes that change no row move the marker: the next capture is hashed, only once.

    It commits nothing, so the lake keeps no fold under the new marker; the
    catalog keeps that capture's, and the capture after it is confirmed by it.
    Another writer's commit sets the fold aside the same way, once.
    """
    engine = _open(tmp_path, pg_database)
    try:
        _capture(engine)
        _write(pg_database, "UPDATE items SET qty = qty WHERE id <= 100")
        moved = _capture(engine)
        assert "fold" not in moved  # (hashed as it read: no fold under this marker)
        assert (moved["inserts"], moved["updates"], moved["deletes"]) == (0, 0, 0)
        assert _capture(engine)["fold"] == "same"
        assert _capture(engine)["fold"] == "same"
        _write(pg_database, "INSERT INTO items (id) VALUES (4000)")
        assert _capture(engine)["inserts"] == 1  # (a second file)
        table = deltalake.DeltaTable(str(tmp_path / "lake" / "pg" / "items"))
        assert table.optimize.compact()["numFilesRemoved"] == 2
        assert "fold" not in _capture(engine)  # (after another writer's commit: hashed)
        assert _capture(engine)["fold"] == "same"
        _write(pg_database, "UPDATE items SET qty = 99 WHERE id = 7", counted=False)
        changed = _capture(engine)  # (the marker did not move: the fold finds the change)
        assert changed["fold"] == "differed" and changed["updates"] == 1
        assert _capture(engine)["fold"] == "same"
        assert _lake(engine) == _source(pg_database)
        assert len(_commits(tmp_path)) == 3  # (the first capture, the insert, the change)
    finally:
        engine.close()


MARIADB_PROJECT = """\
version: 1
lake: ./lake
catalog: sqlite:///.combined/catalog.db
sources:
  shop:
    connector: mariadb
    config:
      dsn: {dsn}
    datasets:
      stock:
        key: [id]
"""


def _maria(dsn: str, *statements: str) -> None:
    import pymysql

    from combined.connectors.mariadb._connect import Settings

    with pymysql.connect(**Settings.from_config({"dsn": dsn}).connect_kwargs()) as conn:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
        conn.commit()


def test_mariadb_an_unchanged_table_is_confirmed_and_a_write_is_captured(
    tmp_path: Path, mariadb_database: str
) -> None:
    """The table's last write time is the marker; the fold confirms or the rows are hashed."""
    _maria(
        mariadb_database,
        "CREATE TABLE stock (id bigint PRIMARY KEY, sku varchar(20), qty int,"
        " price decimal(12,2), at datetime(6), note text) ENGINE=InnoDB",
        "INSERT INTO stock SELECT seq, CONCAT('sku', seq), seq % 9, seq * 1.5,"
        " '2026-01-01' + INTERVAL seq SECOND, IF(seq % 3 = 0, NULL, 'n')"
        " FROM seq_1_to_2000",
    )
    (tmp_path / "combined.yaml").write_text(MARIADB_PROJECT.format(dsn=mariadb_database))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert _capture(engine, "stock")["inserts"] == 2000
        assert _commits_of(tmp_path, "shop", "stock")[0]["capture_fold"]["marker"].startswith(
            "mdb1:"
        )
        again = _capture(engine, "stock")
        assert again["fold"] == "same" and again["deliveries"] == 0
        time.sleep(1.1)  # (the write time is kept to the second)
        _maria(mariadb_database, "UPDATE stock SET qty = 100 WHERE id = 7")
        changed = _capture(engine, "stock")
        assert "fold" not in changed and changed["updates"] == 1
        rows = engine.sql("SELECT qty FROM shop.stock WHERE id = 7").to_pylist()
        assert rows == [{"qty": 100}]
    finally:
        engine.close()


SQLITE_PROJECT = """\
version: 1
lake: ./lake
catalog: sqlite:///.combined/catalog.db
sources:
  depot:
    connector: sqlite
    config:
      path: ./depot.db
    datasets:
      parts:
        key: [id]
"""


def _sqlite(root: Path, *statements: str) -> None:
    import sqlite3

    with sqlite3.connect(root / "depot.db") as conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()


def test_sqlite_the_file_is_the_marker_and_the_fold_decides(tmp_path: Path) -> None:
    """A write the file's times do not show (a coarse clock, here set back) is found."""
    _sqlite(
        tmp_path,
        "CREATE TABLE parts (id integer PRIMARY KEY, name text, weight real)",
        "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 500)"
        " INSERT INTO parts SELECT i, 'part ' || i, i / 4.0 FROM s",
    )
    (tmp_path / "combined.yaml").write_text(SQLITE_PROJECT)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert _capture(engine, "parts")["inserts"] == 500
        assert _capture(engine, "parts")["fold"] == "same"
        _sqlite(tmp_path, "UPDATE parts SET name = 'part 8' WHERE id = 9")  # (same size)
        assert "fold" not in _capture(engine, "parts")  # the file moved: hashed as read
        before = (tmp_path / "depot.db").stat()
        _sqlite(tmp_path, "UPDATE parts SET name = 'part 9' WHERE id = 9")
        os.utime(tmp_path / "depot.db", ns=(before.st_atime_ns, before.st_mtime_ns))
        assert (tmp_path / "depot.db").stat().st_size == before.st_size
        changed = _capture(engine, "parts")
        assert changed["fold"] == "differed" and changed["updates"] == 1
        rows = engine.sql("SELECT name FROM depot.parts WHERE id = 9").to_pylist()
        assert rows == [{"name": "part 9"}]
    finally:
        engine.close()


def test_a_table_without_a_key_is_folded_with_its_repeats(tmp_path: Path, pg_database: str) -> None:
    """``key: []``: a repeat added where the statistics do not see it is a row of its own."""
    _write(
        pg_database,
        "CREATE TABLE lines (sku text, qty int)",
        "INSERT INTO lines VALUES ('a', 1), ('a', 1), ('b', 2)",
    )
    project = PROJECT.format(dsn=pg_database).replace(
        "items:\n        key: [id]", "lines:\n        key: []"
    )
    (tmp_path / "combined.yaml").write_text(project)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _capture(engine, "lines")
        assert _capture(engine, "lines")["fold"] == "same"
        _write(pg_database, "INSERT INTO lines VALUES ('a', 1)", counted=False)
        changed = _capture(engine, "lines")
        assert changed["fold"] == "differed" and changed["inserts"] == 1
        rows = engine.sql("SELECT sku, qty FROM pg.lines ORDER BY sku").to_pylist()
        assert [(r["sku"], r["qty"]) for r in rows] == [("a", 1)] * 3 + [("b", 2)]
    finally:
        engine.close()


def test_a_partitioned_table_is_marked_by_its_partitions(tmp_path: Path, pg_database: str) -> None:
    """A write to one partition moves the marker; a partition attached since, too."""
    _write(
        pg_database,
        "CREATE TABLE events (id bigint, kind text, PRIMARY KEY (id)) PARTITION BY RANGE (id)",
        "CREATE TABLE events_a PARTITION OF events FOR VALUES FROM (0) TO (1000)",
        "CREATE TABLE events_b PARTITION OF events FOR VALUES FROM (1000) TO (2000)",
        "INSERT INTO events SELECT i, 'k' || (i % 5) FROM generate_series(0, 1999) i",
    )
    project = PROJECT.format(dsn=pg_database).replace("items:", "events:")
    (tmp_path / "combined.yaml").write_text(project)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _capture(engine, "events")
        assert _capture(engine, "events")["fold"] == "same"
        _write(pg_database, "UPDATE events SET kind = 'moved' WHERE id = 1500")
        changed = _capture(engine, "events")
        assert "fold" not in changed and changed["updates"] == 1
        _write(
            pg_database,
            "CREATE TABLE events_c (id bigint PRIMARY KEY, kind text)",
            "INSERT INTO events_c VALUES (2500, 'c')",
            "ALTER TABLE events ATTACH PARTITION events_c FOR VALUES FROM (2000) TO (3000)",
        )
        attached = _capture(engine, "events")
        assert "fold" not in attached and attached["inserts"] == 1
        _write(pg_database, "DELETE FROM events WHERE id = 2500", counted=False)
        gone = _capture(engine, "events")
        assert gone["fold"] == "differed" and gone["deletes"] == 1
    finally:
        engine.close()


def test_values_duckdb_hashes_alike_changed_unseen_by_the_statistics_are_found(
    tmp_path: Path, pg_database: str
) -> None:
    """DuckDB's hash() tells neither 0 from -1 as 128-bit integers (numeric(38, 2) 0.00
    and -0.01) nor texts whose bytes 7 and 15 change in step: the fold must."""
    _write(
        pg_database,
        "CREATE TABLE balances (id bigint PRIMARY KEY, amount numeric(38, 2),"
        " marks numeric(30, 0)[], code text)",
        "INSERT INTO balances VALUES (1, 0.00, NULL, 'a'), (2, 5.00, '{0, 7}', 'b'),"
        " (3, 1.00, NULL, 'ACCOUNT -000001 ')",
    )
    project = PROJECT.format(dsn=pg_database).replace("items:", "balances:")
    (tmp_path / "combined.yaml").write_text(project)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _capture(engine, "balances")
        assert _capture(engine, "balances")["fold"] == "same"
        _write(
            pg_database,
            "UPDATE balances SET amount = -0.01 WHERE id = 1",
            "UPDATE balances SET marks = '{-1, 7}' WHERE id = 2",
            counted=False,
        )
        changed = _capture(engine, "balances")
        assert changed["fold"] == "differed" and changed["updates"] == 2
        # (alone: any other change makes the whole capture another fold)
        _write(
            pg_database, "UPDATE balances SET code = 'ACCOUNT~-000001.' WHERE id = 3", counted=False
        )
        changed = _capture(engine, "balances")
        assert changed["fold"] == "differed" and changed["updates"] == 1
        rows = engine.sql("SELECT amount, marks, code FROM pg.balances ORDER BY id").to_pylist()
        assert [
            (str(r["amount"]), [str(m) for m in r["marks"] or []], r["code"]) for r in rows
        ] == [
            ("-0.01", [], "a"),
            ("5.00", ["-1", "7"], "b"),
            ("1.00", [], "ACCOUNT~-000001."),
        ]
    finally:
        engine.close()


def _view_project(root: Path, dsn: str, view: str) -> Engine:
    (root / "combined.yaml").write_text(PROJECT.format(dsn=dsn).replace("items:", f"{view}:"))
    return Engine.open(root / "combined.yaml")


def test_a_view_is_marked_by_the_tables_it_reads_and_its_definition(
    tmp_path: Path, pg_database: str
) -> None:
    """A view over a view and a join: a write to either table, or a new definition, moves it."""
    _write(
        pg_database,
        "CREATE TABLE kinds (k int PRIMARY KEY, label text)",
        "INSERT INTO kinds SELECT i, 'kind ' || i FROM generate_series(0, 6) i",
        "CREATE TABLE goods (id bigint PRIMARY KEY, k int, price numeric(10, 2))",
        "INSERT INTO goods SELECT i, i % 7, i * 0.5 FROM generate_series(1, 2000) i",
        "CREATE VIEW dear AS SELECT id, k, price FROM goods WHERE price > 10",
        "CREATE VIEW shelf AS SELECT d.id, d.price, k.label || '!' AS label"
        " FROM dear d JOIN kinds k USING (k)",
    )
    engine = _view_project(tmp_path, pg_database, "shelf")
    try:
        first = _capture(engine, "shelf")
        assert first["inserts"] == 1980
        (commit,) = _commits_of(tmp_path, "pg", "shelf")
        assert commit["capture_fold"]["marker"].startswith("pgv1:")
        assert _capture(engine, "shelf")["fold"] == "same"
        _write(pg_database, "UPDATE kinds SET label = 'renamed' WHERE k = 3")
        joined = _capture(engine, "shelf")
        assert "fold" not in joined and joined["updates"] == 283  # (k = 3, id > 20)
        assert _capture(engine, "shelf")["fold"] == "same"
        _write(pg_database, "UPDATE goods SET price = 1 WHERE id = 100")  # (leaves the view)
        below = _capture(engine, "shelf")
        assert "fold" not in below and below["deletes"] == 1
        _write(
            pg_database,
            "CREATE OR REPLACE VIEW dear AS SELECT id, k, price FROM goods WHERE price > 20",
        )
        redefined = _capture(engine, "shelf")
        assert "fold" not in redefined and redefined["deletes"] == 20
        _write(pg_database, "UPDATE kinds SET label = 'quiet' WHERE k = 4", counted=False)
        unseen = _capture(engine, "shelf")  # (the marker did not move: the fold finds it)
        assert unseen["fold"] == "differed" and unseen["updates"] > 0
        lake = engine.sql("SELECT id, price, label FROM pg.shelf ORDER BY id").to_pylist()
        with psycopg.connect(pg_database) as conn:
            source = conn.execute("SELECT id, price, label FROM shelf ORDER BY id").fetchall()
        assert [tuple(r.values()) for r in lake] == [tuple(r) for r in source]
    finally:
        engine.close()


def test_a_view_that_reads_the_clock_or_a_volatile_function_has_no_marker(
    tmp_path: Path, pg_database: str
) -> None:
    """Its rows move without a write: each is hashed as read, and no fold is recorded."""
    _write(
        pg_database,
        "CREATE TABLE goods (id bigint PRIMARY KEY, made date)",
        "INSERT INTO goods SELECT i, date '2026-01-01' + i FROM generate_series(1, 50) i",
        "CREATE FUNCTION fresh(d date) RETURNS boolean STABLE LANGUAGE sql"
        " AS 'SELECT d > date ''2026-01-10'''",
        "CREATE VIEW recent AS SELECT id FROM goods WHERE made > CURRENT_DATE - 400",
        "CREATE VIEW recent2 AS SELECT id FROM goods WHERE made > now() - interval '400 days'",
        "CREATE VIEW sampled AS SELECT id FROM goods WHERE random() < 2",
        "CREATE VIEW mine AS SELECT id FROM goods WHERE fresh(made)",
        "CREATE VIEW plain AS SELECT id, made FROM goods WHERE made > date '2026-01-10'",
    )
    for n, view in enumerate(("recent", "recent2", "sampled", "mine", "plain")):
        root = tmp_path / str(n)
        root.mkdir()
        engine = _view_project(root, pg_database, view)
        try:
            assert _capture(engine, view)["inserts"] > 0
            again = _capture(engine, view)
            (commit,) = _commits_of(root, "pg", view)
            if view == "plain":
                assert again["fold"] == "same" and "capture_fold" in commit
            else:
                assert "fold" not in again and "capture_fold" not in commit, view
        finally:
            engine.close()
