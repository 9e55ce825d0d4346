"""A PostgreSQL change stream kept as events (``sync_mode: append``): values left unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from tests.engine.test_cdc_capture import PROJECT

from combined import cdc
from combined.engine import Engine

#: A text of 3,200 characters, stored out of line (``STORAGE EXTERNAL``: never compressed).
BODY = "repeat(md5({!r}), 100)"


def _events(engine: Engine, run_id: str) -> list[tuple[Any, ...]]:
    """The run's events: (id, op, qty, md5 of body), by id then op."""
    rows = engine.sql(
        "SELECT id, _combined_op AS op, qty, md5(body) AS b FROM pg.items "
        f"WHERE _combined_run_id = '{run_id}' ORDER BY id, op"
    ).to_pylist()
    return [tuple(r.values()) for r in rows]


def _md5(conn: psycopg.Connection[Any], text: str) -> str:
    row = conn.execute(f"SELECT md5({BODY.format(text)})").fetchone()
    assert row is not None
    return str(row[0])


def test_an_event_stream_keeps_the_toasted_values_an_update_left_unchanged(
    tmp_path: Path, cdc_db: Any
) -> None:
    # pgoutput sends an update that leaves a TOASTed value alone without it
    # (marked unchanged). An append dataset's capture never read its lake:
    # the event stored null there, as if the update had set it to null.
    dsn = cdc_db.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, body text)")
        conn.execute("ALTER TABLE items ALTER COLUMN body SET STORAGE EXTERNAL")
        for i in range(1, 6):
            conn.execute(f"INSERT INTO items VALUES ({i}, {i}, {BODY.format(f'a{i}')})")
        a = {i: _md5(conn, f"a{i}") for i in range(1, 6)}
    project = PROJECT.format(dsn=dsn, prefix=cdc_db.prefix, table="items")
    (tmp_path / "combined.yaml").write_text(project + "        sync_mode: append\n")
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = 10 WHERE id = 1")  # body left alone
            conn.execute("UPDATE items SET body = NULL WHERE id = 2")  # a real null
            conn.execute("UPDATE items SET id = 103 WHERE id = 3")  # a move, body left alone
            conn.execute(f"UPDATE items SET body = {BODY.format('b4')} WHERE id = 4")
            with conn.transaction():  # one transaction's two changes of a row
                conn.execute(f"UPDATE items SET body = {BODY.format('b5')} WHERE id = 5")
                conn.execute(f"UPDATE items SET body = {BODY.format('c5')} WHERE id = 5")
            b4, b5, c5 = (_md5(conn, t) for t in ("b4", "b5", "c5"))
        (second,) = engine.capture()
        assert second.state == "succeeded", second.error
        assert _events(engine, second.id) == [
            (1, "update", 10, a[1]),
            (2, "update", 2, None),
            (3, "delete", None, None),
            (4, "update", 4, b4),
            (5, "update", 5, b5),
            (5, "update", 5, c5),
            (103, "insert", 3, a[3]),  # (the stream sent an update of a key never held)
        ]
        # Each id's newest event, from the capture before, holds the value left alone.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = -qty WHERE id IN (1, 2, 4, 5, 103)")
        (third,) = engine.capture()
        assert third.state == "succeeded", third.error
        assert _events(engine, third.id) == [
            (1, "update", -10, a[1]),
            (2, "update", -2, None),
            (4, "update", -4, b4),
            (5, "update", -5, c5),
            (103, "update", -3, a[3]),
        ]
        with psycopg.connect(dsn) as conn:
            source = conn.execute("SELECT id, md5(body) FROM items ORDER BY id").fetchall()
        assert [(i, b) for i, _, _, b in _events(engine, third.id)] == source
    finally:
        engine.close()


def test_one_transactions_changes_in_several_deliveries_fill_from_the_later_one(
    tmp_path: Path, cdc_db: Any
) -> None:
    # A row changed twice in one transaction: its two events share their
    # capture, commit LSN and emission time. Cut into two Deliveries, the
    # fill told them apart by their files' names (or their rows in a file
    # delta-rs wrote, where it deals batches to its partitions in turn) and
    # could take the older value. Each pair here is split, starting at an
    # even and then an odd place of the stream (one row before them moves
    # the rest by one), so no dealing keeps every pair in order.
    dsn, n = cdc_db.dsn, 20
    ids = range(2 * n + 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, body text)")
        conn.execute("ALTER TABLE items ALTER COLUMN body SET STORAGE EXTERNAL")
        for i in ids:
            conn.execute(f"INSERT INTO items VALUES ({i}, {i}, {BODY.format(f'a{i}')})")
    project = PROJECT.format(dsn=dsn, prefix=cdc_db.prefix, table="items")
    (tmp_path / "combined.yaml").write_text(
        project + "        sync_mode: append\n        delivery:\n          max_rows: 1\n"
    )
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
            for i in [*range(1, n + 1), 0, *range(n + 1, 2 * n + 1)]:
                for text in (f"b{i}", f"c{i}")[: 1 if i == 0 else 2]:
                    conn.execute(f"UPDATE items SET body = {BODY.format(text)} WHERE id = {i}")
        (second,) = engine.capture()
        assert second.state == "succeeded", second.error
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = -qty")  # body left alone
            newest = {i: _md5(conn, f"b{i}" if i == 0 else f"c{i}") for i in ids}
        (third,) = engine.capture()
        assert third.state == "succeeded", third.error
        wrong = [i for i, _, _, b in _events(engine, third.id) if b != newest[i]]
        assert wrong == []
    finally:
        engine.close()


def test_an_event_streams_updates_and_deletes_are_linked_not_rewritten(
    tmp_path: Path, cdc_db: Any
) -> None:
    """An append capture holding an update or a delete wrote its Deliveries' rows again
    through delta-rs (a merge's path), which costs a rewrite and deals the batches to
    its partitions in turn: a Delivery's rows lost the stream's order."""
    import hashlib

    from combined.lake._files import linked_name

    dsn = cdc_db.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, body text)")
        conn.execute("INSERT INTO items SELECT g, g, 'x' FROM generate_series(1, 50) g")
    project = PROJECT.format(dsn=dsn, prefix=cdc_db.prefix, table="items")
    (tmp_path / "combined.yaml").write_text(project + "        sync_mode: append\n")
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        table = engine.layout.dataset_table("pg", "items")
        before = set(table.files())
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = -qty WHERE id <= 10")
            conn.execute("DELETE FROM items WHERE id > 45")
        (second,) = engine.capture()
        assert second.state == "succeeded", second.error
        added = [Path(f) for f in set(table.files()) - before]
        assert added
        assert all(f.name == linked_name(hashlib.sha256(f.read_bytes()).hexdigest()) for f in added)
        counts = engine.sql(
            "SELECT _combined_op AS op, count(*) AS n FROM pg.items "
            f"WHERE _combined_run_id = '{second.id}' GROUP BY op ORDER BY op"
        ).to_pylist()
        assert counts == [{"op": "delete", "n": 5}, {"op": "update", "n": 10}]
    finally:
        engine.close()


def _opened(tmp_path: Path, cdc_db: Any, *statements: str) -> Engine:
    """An append dataset of table ``items`` (made by ``statements``), captured once."""
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)
    project = PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, table="items")
    (tmp_path / "combined.yaml").write_text(project + "        sync_mode: append\n")
    engine = Engine.open(tmp_path / "combined.yaml")
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    return engine


def _appended(engine: Engine, run_id: str) -> list[tuple[Any, ...]]:
    """The events the run appended: (id, op, qty, note), by id."""
    rows = engine.sql(
        "SELECT id, _combined_op AS op, qty, note FROM pg.items "
        f"WHERE _combined_run_id = '{run_id}' ORDER BY id"
    ).to_pylist()
    return [tuple(r.values()) for r in rows]


def _resnapshot(engine: Engine) -> Any:
    """`combined cdc teardown` then `combined cdc setup`: the new snapshot's Run."""
    cdc.teardown(engine, "pg")
    _, run = cdc.setup(engine, "pg")
    assert run.state == "succeeded", run.error
    return run


def test_a_new_snapshot_appends_only_what_differs_from_each_ids_newest_event(
    tmp_path: Path, cdc_db: Any
) -> None:
    # A new snapshot (teardown, then setup) of an event stream appended the
    # whole table again as inserts, unchanged rows included: a consumer that
    # counts inserts or replays the stream counted every row once a snapshot.
    dsn = cdc_db.dsn
    engine = _opened(
        tmp_path,
        cdc_db,
        "CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text)",
        "INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 6) g",
    )
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = 10 WHERE id = 1")  # newest: an update
            conn.execute("DELETE FROM items WHERE id = 2")  # newest: a delete
        (second,) = engine.capture()
        assert second.state == "succeeded", second.error
        # The gap: changes no stream carries.
        cdc.teardown(engine, "pg")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (2, 20, 'back'), (7, 7, 'n7')")
            conn.execute("UPDATE items SET note = 'changed' WHERE id = 3")
            conn.execute("DELETE FROM items WHERE id = 4")
        _, third = cdc.setup(engine, "pg")
        assert third.state == "succeeded", third.error
        assert _appended(engine, third.id) == [
            (2, "insert", 20, "back"),  # its newest event a delete
            (3, "update", 3, "changed"),
            (4, "delete", None, None),  # deleted in the gap: the key alone, as a stream's
            (7, "insert", 7, "n7"),
        ]
        assert third.stats is not None
        stats = third.stats["items"]
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (2, 1, 1)
        # Nothing changed since: a new snapshot appends nothing.
        fourth = _resnapshot(engine)
        assert _appended(engine, fourth.id) == []
        (total,) = engine.sql("SELECT count(*) AS n FROM pg.items").to_pylist()
        assert total["n"] == 6 + 2 + 4
        # The stream goes on from the new snapshot.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = -qty WHERE id = 5")
        (fifth,) = engine.capture()
        assert fifth.state == "succeeded", fifth.error
        assert _appended(engine, fifth.id) == [(5, "update", -5, "n5")]
    finally:
        engine.close()


def test_a_new_snapshot_counts_no_event_older_than_the_newest_truncate(
    tmp_path: Path, cdc_db: Any
) -> None:
    # Each id's newest event is compared only when it is newer than the
    # stream's newest truncate: an id the truncate emptied is gone already.
    engine = _opened(
        tmp_path,
        cdc_db,
        "CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text)",
        "INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 3) g",
    )
    try:
        with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE items")
            conn.execute("INSERT INTO items VALUES (1, 1, 'n1'), (4, 4, 'n4')")
        (second,) = engine.capture()
        assert second.state == "succeeded", second.error
        cdc.teardown(engine, "pg")
        with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (2, 2, 'n2')")
            conn.execute("DELETE FROM items WHERE id = 4")
        _, third = cdc.setup(engine, "pg")
        assert third.state == "succeeded", third.error
        assert _appended(engine, third.id) == [
            (2, "insert", 2, "n2"),  # its snapshot event older than the truncate
            (4, "delete", None, None),
        ]
    finally:
        engine.close()
