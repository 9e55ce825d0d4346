"""CDC captures through the engine: stitched snapshot, then the stream, exactly once."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from combined.connectors.abc import StreamOwner
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._publication import ensure_publication
from combined.connectors.postgres._replication import (
    ReplicationStream,
    create_slot,
    drop_slot,
    slot_status,
)
from combined.connectors.postgres._slot_owner import Claim
from combined.engine import Engine
from combined.lake import LakeLayout
from combined.lake._positions import LakePositions
from combined.lake._project import project_id

PROJECT = """\
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
        relation: public.{table}
        key: [id]
        strategy: cdc
"""


@pytest.fixture
def cdc_project(tmp_path: Path, cdc_db) -> tuple[Path, str, str]:
    pg_database = cdc_db.dsn
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text, body text)")
        conn.execute("INSERT INTO items SELECT g, g, 'n' || g, NULL FROM generate_series(1, 500) g")
    (tmp_path / "combined.yaml").write_text(
        PROJECT.format(dsn=pg_database, prefix=cdc_db.prefix, table="items")
    )
    return tmp_path, pg_database, cdc_db.slot("public.items")


def _lake(engine: Engine) -> list[tuple[object, ...]]:
    rows = engine.sql("SELECT id, qty, note, body FROM pg.items ORDER BY id").to_pylist()
    return [tuple(r.values()) for r in rows]


def _source(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute("SELECT id, qty, note, body FROM items ORDER BY id"))


def _checkpoint_lsn(root: Path) -> str:
    """The LSN the next read resumes from: the lake's newest commit's, or the
    position captures that changed no row kept after it (``lake._positions``)."""
    layout = LakeLayout(root / "lake")
    meta = LakePositions(layout).resumed(
        "pg", "items", layout.dataset_table("pg", "items").latest_commit()
    )
    assert meta is not None
    return str(meta["checkpoint"]["lsn"])


def test_stitched_snapshot_then_stream_lands_every_change_once(
    cdc_project: tuple[Path, str, str],
) -> None:
    from combined.connectors.postgres._pgoutput import text_to_lsn

    root, dsn, slot = cdc_project
    engine = Engine.open(root / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert _lake(engine) == _source(dsn)
        assert slot_status(Settings(dsn), slot).exists

        big = "x" * 20_000  # stored out of line (TOAST)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET body = %s WHERE id = 7", (big,))
            conn.execute("INSERT INTO items VALUES (501, 1, 'new', NULL)")
            conn.execute("DELETE FROM items WHERE id BETWEEN 10 AND 14")
            conn.execute("UPDATE items SET qty = 99 WHERE id <= 3")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert run.stats["items"]["deletes"] == 5
        assert _lake(engine) == _source(dsn)

        # an update that leaves the TOASTed column alone must keep its value
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = 1000 WHERE id = 7")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        row = engine.sql(
            "SELECT qty, length(body) AS n, _combined_op AS op, _combined_emitted_at AS at, "
            "_combined_source_position AS pos FROM pg.items WHERE id = 7"
        ).to_pylist()[0]
        assert (row["qty"], row["n"], row["op"]) == (1000, 20_000, "update")
        assert row["at"] is not None and "/" in row["pos"]
        assert _lake(engine) == _source(dsn)

        # the slot is never confirmed past what the lake holds
        confirmed = slot_status(Settings(dsn), slot).confirmed_flush_lsn
        assert confirmed is not None and confirmed <= text_to_lsn(_checkpoint_lsn(root))

        # a quiet capture still moves the checkpoint and the slot with it
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE other (id int)")
            conn.execute("INSERT INTO other SELECT generate_series(1, 1000)")
        before = _checkpoint_lsn(root)
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert text_to_lsn(_checkpoint_lsn(root)) > text_to_lsn(before)
        assert _lake(engine) == _source(dsn)
    finally:
        engine.close()


def test_truncate_is_an_explicit_transition(cdc_project: tuple[Path, str, str]) -> None:
    root, dsn, _ = cdc_project
    engine = Engine.open(root / "combined.yaml")
    try:
        engine.capture()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = 0 WHERE id = 1")
            conn.execute("TRUNCATE items")
            conn.execute("INSERT INTO items VALUES (1, 5, 'again', NULL), (900, 9, 'z', NULL)")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert run.stats["items"]["deletes"] == 499
        assert _lake(engine) == _source(dsn)
    finally:
        engine.close()


def _slot_dropped_after_a_delete(engine: Engine, dsn: str, slot: str) -> None:
    """Captured once; then a row deleted, and the slot dropped with that change."""
    engine.capture()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM items WHERE id = 1")
    drop_slot(Settings(dsn), slot)


def test_a_lost_slot_fails_loudly_and_never_resumes_with_a_gap(
    cdc_project: tuple[Path, str, str],
) -> None:
    root, dsn, slot = cdc_project
    engine = Engine.open(root / "combined.yaml")
    try:
        _slot_dropped_after_a_delete(engine, dsn, slot)
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (a person takes a new snapshot: no retry helps)
        assert "does not exist" in (run.error or "") and "teardown" in (run.error or "")
        assert len(engine.run(run.id)["attempts"]) == 1  # not transient: no blind retry
        assert engine.sql("SELECT count(*) AS n FROM pg.items").column("n")[0].as_py() == 500
    finally:
        engine.close()


def test_a_slot_made_again_past_the_lake_is_refused_not_streamed_with_a_gap(
    cdc_project: tuple[Path, str, str],
) -> None:
    """The slot dropped, then made again under its name by someone (at the WAL's
    position then): the capture succeeded from there, the changes between lost for
    good (found by a PostgreSQL CDC review). The slot is confirmed only up to what
    the lake committed: one past it was read by another."""
    root, dsn, slot = cdc_project
    engine = Engine.open(root / "combined.yaml")
    try:
        _slot_dropped_after_a_delete(engine, dsn, slot)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            conn.execute("UPDATE items SET qty = -2 WHERE id = 2")
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert "past the checkpoint of 'items' in the lake" in (run.error or "")
        assert "teardown" in (run.error or "")
        assert engine.sql("SELECT count(*) AS n FROM pg.items").column("n")[0].as_py() == 500
    finally:
        engine.close()


def _captured_alone(root: Path) -> tuple[str, str | None]:
    """One capture in an engine of its own: its state and error."""
    engine = Engine.open(root / "combined.yaml")
    try:
        (run,) = engine.capture()
        return run.state, run.error
    finally:
        engine.close()


def test_a_lake_restored_from_an_older_backup_is_refused_not_streamed_with_a_gap(
    cdc_project: tuple[Path, str, str],
) -> None:
    """The project (its lake and catalog) restored from a copy older than the slot's
    position: the capture streamed from the slot's position, and the lake never got
    the changes between (row 1 kept though deleted)."""
    import shutil

    root, dsn, _ = cdc_project
    assert _captured_alone(root)[0] == "succeeded"
    backup = root.parent / f"{root.name}-backup"
    shutil.copytree(root, backup)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM items WHERE id = 1")
    assert _captured_alone(root)[0] == "succeeded"
    shutil.rmtree(root)
    shutil.copytree(backup, root)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET qty = -2 WHERE id = 2")
    state, error = _captured_alone(root)
    assert state == "needs_review", error
    assert "restored from an older backup" in (error or "")


def test_a_column_added_mid_stream_evolves_and_is_recorded(
    cdc_project: tuple[Path, str, str],
) -> None:
    from combined.catalog import data as cat

    root, dsn, _ = cdc_project
    engine = Engine.open(root / "combined.yaml")
    try:
        engine.capture()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = -1 WHERE id = 1")
            conn.execute("ALTER TABLE items ADD COLUMN extra int")
            conn.execute("UPDATE items SET extra = 42 WHERE id <= 3")
            conn.execute("INSERT INTO items VALUES (600, 6, 'six', NULL, 7)")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        rows = engine.sql(
            "SELECT id, qty, extra FROM pg.items WHERE id IN (1, 2, 4, 600) ORDER BY id"
        ).to_pylist()
        assert rows == [
            {"id": 1, "qty": -1, "extra": 42},
            {"id": 2, "qty": 2, "extra": 42},
            {"id": 4, "qty": 4, "extra": None},
            {"id": 600, "qty": 6, "extra": 7},
        ]
        with engine.catalog.begin() as conn:
            drift = cat.activity(conn, kind="drift")
        assert [(d.body["class"], d.body["field"], d.body["outcome"]) for d in drift] == [
            ("new_field", "extra", "evolve")
        ]
    finally:
        engine.close()


def test_concurrent_writers_during_the_initial_snapshot_land_exactly_once(
    cdc_project: tuple[Path, str, str],
) -> None:
    import threading

    root, dsn, _ = cdc_project
    stop = threading.Event()

    def writer() -> None:
        n = 10_000
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                n += 1
                conn.execute("INSERT INTO items VALUES (%s, 1, 'w', NULL)", (n,))
                conn.execute("UPDATE items SET qty = qty + 1 WHERE id = %s", (n % 500 + 1,))
                conn.execute("DELETE FROM items WHERE id = %s", (n - 5,))

    thread = threading.Thread(target=writer)
    thread.start()
    engine = Engine.open(root / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        stop.set()
        thread.join()
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert _lake(engine) == _source(dsn)
        dup = (
            engine.sql("SELECT count(*) - count(DISTINCT id) AS d FROM pg.items")
            .column("d")[0]
            .as_py()
        )
        assert dup == 0
    finally:
        stop.set()
        thread.join()
        engine.close()


def test_status_reports_slot_lag(cdc_project: tuple[Path, str, str], tools) -> None:
    root, dsn, slot = cdc_project
    engine = Engine.open(root / "combined.yaml")
    try:
        engine.capture()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO items SELECT g, 0, 'lag', NULL FROM generate_series(701, 900) g"
            )
        (row,) = engine.status()
        assert row["slot"]["exists"] and row["slot"]["lag_bytes"] > 0
    finally:
        engine.close()
    shown = tools.cli(root, "status", env={"COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    assert " B" in shown.stdout and "pg.items" in shown.stdout


def test_append_mode_keeps_every_change_event_including_deletes(
    cdc_project: tuple[Path, str, str],
) -> None:
    root, dsn, _ = cdc_project
    text = (
        (root / "combined.yaml")
        .read_text()
        .replace("        strategy: cdc\n", "        strategy: cdc\n        sync_mode: append\n")
    )
    (root / "combined.yaml").write_text(text)
    engine = Engine.open(root / "combined.yaml")
    try:
        engine.capture()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = 7 WHERE id = 1")
            conn.execute("UPDATE items SET qty = 8 WHERE id = 1")
            conn.execute("DELETE FROM items WHERE id = 1")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        events = engine.sql(
            "SELECT _combined_op AS op, qty FROM pg.items WHERE id = 1 "
            "ORDER BY _combined_emitted_at NULLS FIRST"
        ).to_pylist()
        assert [e["op"] for e in events] == ["snapshot", "update", "update", "delete"]
        assert [e["qty"] for e in events[:3]] == [1, 7, 8]
        # a truncate is an event too, and the stream goes on after it
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE items")
            conn.execute("INSERT INTO items VALUES (1, 99, 'after', NULL)")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        last = engine.sql(
            "SELECT _combined_op AS op FROM pg.items WHERE _combined_emitted_at IS NOT NULL "
            "ORDER BY _combined_emitted_at DESC, _combined_op LIMIT 2"
        ).to_pylist()
        assert {e["op"] for e in last} == {"insert", "truncate"}
    finally:
        engine.close()


def test_relations_whose_names_once_collided_keep_their_own_slots(tmp_path: Path, cdc_db) -> None:
    # `sales_eu.orders`, `sales.eu_orders` and `sales."EU_ORDERS"` all read
    # `<prefix>_sales_eu_orders` once lower-cased and sanitized: one dataset's
    # first capture took another's slot for a leftover, dropped it, and the
    # other resumed on a slot that started later, losing the changes between.
    dsn = cdc_db.dsn
    relations = {"eu": "sales_eu.orders", "other": "sales.eu_orders", "upper": "sales.EU_ORDERS"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA sales_eu; CREATE SCHEMA sales")
        for table in ("sales_eu.orders", "sales.eu_orders", 'sales."EU_ORDERS"'):
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
        conn.execute("INSERT INTO sales_eu.orders SELECT g, g FROM generate_series(1, 5) g")
    slots = {name: cdc_db.slot(rel) for name, rel in relations.items()}
    assert len(set(slots.values())) == 3
    project = PROJECT.format(dsn=dsn, prefix=cdc_db.prefix, table="unused").replace(
        "      slot_prefix:", "      schemas: [sales_eu, sales]\n      slot_prefix:"
    )
    project = project[: project.index("      items:")] + "".join(
        f"      {name}:\n        relation: {rel}\n        key: [id]\n        strategy: cdc\n"
        for name, rel in relations.items()
    )
    (tmp_path / "combined.yaml").write_text(project)

    def source_ids() -> list[int]:
        with psycopg.connect(dsn) as conn:
            return [r[0] for r in conn.execute("SELECT id FROM sales_eu.orders ORDER BY id")]

    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture(["pg.eu"])
        assert run.state == "succeeded", run.error
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO sales_eu.orders SELECT g, g FROM generate_series(6, 10) g")
        for first in ("pg.other", "pg.upper"):
            (run,) = engine.capture([first])
            assert run.state == "succeeded", run.error
        (run,) = engine.capture(["pg.eu"])
        assert run.state == "succeeded", run.error
        lake = engine.sql("SELECT id FROM pg.eu ORDER BY id").column("id").to_pylist()
        assert lake == source_ids()
        assert all(slot_status(Settings(dsn), s).exists for s in slots.values())
    finally:
        engine.close()


def test_a_first_capture_never_drops_a_slot_that_a_process_holds(
    cdc_project: tuple[Path, str, str],
) -> None:
    root, dsn, slot = cdc_project
    pg = Settings(dsn)
    engine = Engine.open(root / "combined.yaml")
    # The project's own publication and slot (as an interrupted first capture
    # leaves them), which another process streams from.
    owner = StreamOwner(project_id(engine.layout))
    ensure_publication(pg, slot, ["public.items"], claim=Claim(owner))
    create_slot(pg, slot).release_snapshot()
    holder = ReplicationStream(pg, slot, slot, 0)
    try:
        (run,) = engine.capture()
        assert run.state == "failed"
        error = run.error or ""
        assert slot in error and "in use" in error and "stop the process" in error
        assert len(engine.run(run.id)["attempts"]) == 1  # not retried: a person decides
        status = slot_status(pg, slot)
        assert status.exists and status.active
    finally:
        holder.close()
        engine.close()


def test_a_key_change_under_replica_identity_full_removes_the_old_key(
    cdc_project: tuple[Path, str, str],
) -> None:
    # Every update under FULL sends the old row; one that changed the key
    # left the old key's row in the lake next to the new one.
    root, dsn, _ = cdc_project
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")
    engine = Engine.open(root / "combined.yaml")
    try:
        engine.capture()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET id = id + 1000 WHERE id <= 3")
            conn.execute("UPDATE items SET qty = -1 WHERE id = 4")
            conn.execute("DELETE FROM items WHERE id = 5")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["items"]["deletes"] == 4
        assert _lake(engine) == _source(dsn)
    finally:
        engine.close()


@pytest.mark.parametrize(
    "statements",
    [
        [
            "DROP TABLE items",
            "CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text, body text)",
        ],
        ["ALTER PUBLICATION {slot} DROP TABLE items"],
        ["DROP PUBLICATION {slot}"],
        [
            "DROP TABLE items",
            "CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text, body text)",
            "INSERT INTO items VALUES (9000, 1, 'before it is published again', NULL)",
            "ALTER PUBLICATION {slot} ADD TABLE items",
        ],
        ["ALTER PUBLICATION {slot} SET (publish = 'insert')"],
    ],
    ids=[
        "dropped_and_created_again",
        "removed_from_publication",
        "publication_dropped",
        "created_again_and_published_again",
        "publishing_less",
    ],
)
def test_a_table_the_slot_no_longer_streams_fails_instead_of_losing_its_changes(
    cdc_project: tuple[Path, str, str], statements: list[str]
) -> None:
    # The slot streams only what its publication covers: captures went on
    # succeeding with no changes while the table's new rows never arrived.
    # Only a new snapshot mends it: the Run ends needs_review (it ended failed,
    # which schedules and `cdc follow` retried for ever).
    root, dsn, slot = cdc_project
    engine = Engine.open(root / "combined.yaml")
    try:
        engine.capture()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement.format(slot=slot))
            conn.execute("INSERT INTO items VALUES (9001, 1, 'unseen', NULL)")
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert "teardown" in (run.error or "") and slot in (run.error or "")
        assert len(engine.run(run.id)["attempts"]) == 1  # a person decides: no blind retry
        assert engine.sql("SELECT count(*) AS n FROM pg.items").column("n")[0].as_py() == 500
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("cause", "mend"),
    [
        ("ALTER PUBLICATION {slot} DROP TABLE items", "ALTER PUBLICATION {slot} ADD TABLE items"),
        (
            "ALTER PUBLICATION {slot} SET (publish = 'insert')",
            "ALTER PUBLICATION {slot} SET (publish = 'insert, update, delete, truncate')",
        ),
    ],
    ids=["removed_from_publication", "publishing_less"],
)
def test_a_publication_mended_after_a_refusal_is_refused_until_a_new_snapshot(
    cdc_project: tuple[Path, str, str], cause: str, mend: str
) -> None:
    # The WAL of the time is decoded as the publication was then: once a person
    # mended it, the next capture passed, the changes made meanwhile lost for good.
    from combined import cdc

    root, dsn, slot = cdc_project
    engine = Engine.open(root / "combined.yaml")
    try:
        engine.capture()
        lsn = _checkpoint_lsn(root)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(cause.format(slot=slot))
            conn.execute("UPDATE items SET qty = -1 WHERE id <= 3")
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(mend.format(slot=slot))
        for _ in range(2):
            (run,) = engine.capture()
            assert run.state == "needs_review", run.error
            assert "kept in the dataset's checkpoint" in (run.error or "")
            assert "teardown" in (run.error or "")
        assert _checkpoint_lsn(root) == lsn  # (the refusals moved no position)
        assert _lake(engine) != _source(dsn)
        cdc.teardown(engine, "pg")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert _lake(engine) == _source(dsn)
    finally:
        engine.close()


def test_a_key_change_keeps_the_unchanged_toast_values_of_the_row(
    cdc_project: tuple[Path, str, str],
) -> None:
    # An update that changes the key sends the old key and, for an
    # out-of-line value it leaves alone, nothing: the new key has no earlier
    # value to take, and the lake wrote null there.
    root, dsn, _ = cdc_project
    body = "(SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 400) g)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE items SET body = {body} WHERE id <= 6")
    engine = Engine.open(root / "combined.yaml")
    try:
        engine.capture()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET id = 1001 WHERE id = 1")  # moved from the lake
            conn.execute("UPDATE items SET id = 2001, qty = -1 WHERE id = 1001")  # and again
            conn.execute("UPDATE items SET qty = -2 WHERE id = 2001")  # then changed in place
            conn.execute("UPDATE items SET id = 3000 WHERE id = 2")  # a key left free ...
            conn.execute("UPDATE items SET id = 2 WHERE id = 3")  # ... taken by another row
            conn.execute("INSERT INTO items VALUES (7000, 7, 'new', repeat(md5('x'), 300))")
            conn.execute("UPDATE items SET id = 7001 WHERE id = 7000")  # inserted, then moved
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET id = 4004 WHERE id = 4")  # alone in its capture
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        moved = "2, 5, 2001, 3000, 4004, 7001"
        digests = f"SELECT id, qty, md5(body) AS b FROM {{}} WHERE id IN ({moved}) ORDER BY id"
        lake = [tuple(r.values()) for r in engine.sql(digests.format("pg.items")).to_pylist()]
        with psycopg.connect(dsn) as conn:
            source = list(conn.execute(digests.format("items")))
        assert len(source) == 6 and all(r[2] is not None for r in source)
        assert lake == source
    finally:
        engine.close()


def test_a_column_dropped_while_streaming_meets_the_drift_policy(
    cdc_project: tuple[Path, str, str],
) -> None:
    # Changes before the drop carry the column, changes after it do not: the
    # capture used to fill it with nulls and commit, the drop (policy: fail)
    # judged only by the next capture, after the fact.
    root, dsn, _ = cdc_project
    engine = Engine.open(root / "combined.yaml")
    try:
        engine.capture()
        version = engine.history("pg.items")[0]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET qty = -1 WHERE id = 1")
            conn.execute("ALTER TABLE items DROP COLUMN note")
            conn.execute("UPDATE items SET qty = -2 WHERE id = 2")
        (run,) = engine.capture()
        assert run.state == "needs_review"
        assert "drop on field 'note' (policy: fail)" in (run.error or "")
        assert engine.history("pg.items")[0] == version  # nothing committed
        rows = engine.sql("SELECT qty, note FROM pg.items WHERE id <= 2 ORDER BY id").to_pylist()
        assert rows == [{"qty": 1, "note": "n1"}, {"qty": 2, "note": "n2"}]
    finally:
        engine.close()


def _added_project(tmp_path: Path, cdc_db) -> str:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
        conn.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 100) g")
    # small batches: the fill hands over full batches as it reads
    project = PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, table="t")
    (tmp_path / "combined.yaml").write_text(
        project.replace("strategy: cdc", "strategy: cdc\n        batch_rows: 16")
    )
    cdc_db.slot("public.t")
    return str(cdc_db.dsn)


def _lake_added(engine: Engine, column: str) -> list[tuple[object, ...]]:
    rows = engine.sql(f"SELECT id, v, {column} AS c FROM pg.items ORDER BY id").to_pylist()
    return [(r["id"], r["v"], r["c"]) for r in rows]


def _source_added(dsn: str, column: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute(f"SELECT id, v, {column} FROM t ORDER BY id"))


def test_a_column_added_with_a_default_is_filled_on_every_row(tmp_path: Path, cdc_db) -> None:
    """The rows the default filled get its value, though the stream sends none of them.

    Reproduction (issue 23, #26): ``t (id int primary key, v int)`` with 100
    rows, first capture, then ``ALTER TABLE t ADD COLUMN flag boolean NOT
    NULL DEFAULT false; UPDATE t SET v = -1 WHERE id = 1``, capture: exit 0,
    the source had ``false`` on 100 rows, the lake ``false`` on 1 row and
    NULL on 99, and reconciliation passed.
    """
    dsn = _added_project(tmp_path, cdc_db)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE t ADD COLUMN flag boolean NOT NULL DEFAULT false")
            conn.execute("UPDATE t SET v = -1 WHERE id = 1")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert _lake_added(engine, "flag") == _source_added(dsn, "flag")
        assert engine.sql("SELECT count(*) AS n FROM pg.items WHERE flag IS NULL").to_pylist() == [
            {"n": 0}
        ]

        # a volatile default rewrites the table, and the changes after the
        # ALTER (an insert, a delete, an update of the new column) still win
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE t ADD COLUMN w int NOT NULL DEFAULT (random() * 0)::int + 7")
            conn.execute("UPDATE t SET w = 8 WHERE id = 2")
            conn.execute("DELETE FROM t WHERE id = 3")
            conn.execute("INSERT INTO t VALUES (101, 101, true, 9)")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert _lake_added(engine, "w") == _source_added(dsn, "w")
        assert _lake_added(engine, "flag") == _source_added(dsn, "flag")
        (run,) = engine.capture()  # nothing new: nothing filled again
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["items"]["updates"] == 0
    finally:
        engine.close()
