"""Every command on an object-store lake exactly as on a local one.

Each test runs three times (``ON_EVERY_STORE``): on a local lake, on
an ``s3://`` lake served by a real S3-compatible server on 127.0.0.1, and on
a ``gs://`` lake served by fake-gcs-server behind the adapter that adds GCS's
XML uploads (``tests/_gcs_xml.py``). Before object-store lakes were
supported, every S3 variant failed at ``Engine.open`` ("object-store lakes
... are not supported by this build yet"); before the adapter, every ``gs://``
capture failed at its first commit (fake-gcs-server answered delta-rs'
upload ``400 invalid uploadType``).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import ON_EVERY_STORE

from combined.engine import Engine


def _project(root: Path, tools: Any, lake_url: str, extra: str = "") -> Path:
    tools.make(root)
    project = root / "combined.yaml"
    project.write_text(project.read_text().replace("lake: ./lake", f"lake: {lake_url}") + extra)
    return project


def _rows(engine: Engine, query: str, **kw: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = engine.sql(query, **kw).to_pylist()
    return rows


def _billed(engine: Engine) -> list[tuple[Any, ...]]:
    keys = ("source", "dataset", "month", "mar", "inserts", "updates", "deletes")
    return [tuple(u[k] for k in keys) for u in engine.usage()]


def _check_staging_is_local(root: Path, lake_url: str) -> None:
    """An object-store lake stages under the project; a local one under the lake."""
    staging = root / ".combined" / "staging" if "://" in lake_url else root / "lake" / "_staging"
    assert staging.is_dir()


@ON_EVERY_STORE
def test_snapshot_recapture_with_updates_and_deletes_then_as_of_publication_history_usage(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    engine = Engine.open(_project(tmp_path, tools, lake_url))
    try:
        (first,) = engine.capture()
        assert first.state == "succeeded", first.error
        between = datetime.now(UTC)
        tools.sql(
            tmp_path,
            "UPDATE orders SET status = 'shipped' WHERE id <= 10;"
            "DELETE FROM orders WHERE id > 190; INSERT INTO orders VALUES (500, 1, 'new', 1.0);",
        )
        (second,) = engine.capture()
        assert second.state == "succeeded", second.error
        assert _rows(engine, "SELECT count(*) AS n FROM shop.orders") == [{"n": 191}]
        shipped = "SELECT count(*) AS n FROM shop.orders WHERE status = 'shipped'"
        assert _rows(engine, shipped) == [{"n": 10}]
        # the first publication, by instant and by id
        assert _rows(engine, "SELECT count(*) AS n FROM shop.orders", as_of=between) == [{"n": 200}]
        old = engine.publications(10)[-1]
        assert _rows(engine, shipped, publication=old["id"]) == [{"n": 0}]
        versions = engine.history("shop.orders")
        assert [(v["inserts"], v["updates"], v["deletes"]) for v in versions] == [
            (200, 0, 0),
            (1, 10, 10),
        ]
        (usage,) = [u for u in engine.usage() if u["dataset"] == "orders"]
        assert (usage["mar"], usage["inserts"], usage["updates"], usage["deletes"]) == (
            201,
            201,
            10,
            10,
        )
        _check_staging_is_local(tmp_path, lake_url)
    finally:
        engine.close()


@ON_EVERY_STORE
def test_cursor_append_and_full_refresh(tmp_path: Path, tools: Any, lake_url: str) -> None:
    extra = (
        "      log:\n        key: [id]\n        strategy: cursor\n"
        "        cursor: {column: seq, trust: 'a sequence'}\n"
        "      clicks:\n        sync_mode: append\n"
        "      prices:\n        key: [id]\n        sync_mode: full_refresh\n"
    )
    project = _project(tmp_path, tools, lake_url, extra)
    tools.sql(
        tmp_path,
        "CREATE TABLE log (id INTEGER PRIMARY KEY, seq INT, v TEXT);"
        "INSERT INTO log VALUES (1, 10, 'a'), (2, 20, 'b');"
        "CREATE TABLE clicks (page TEXT, n INTEGER);"
        "INSERT INTO clicks VALUES ('home', 1), ('home', 1), ('cart', 2);"
        "CREATE TABLE prices (id INTEGER PRIMARY KEY, p REAL);"
        "INSERT INTO prices VALUES (1, 1.0), (2, 2.0);",
    )
    engine = Engine.open(project)
    try:
        names = ["shop.log", "shop.clicks", "shop.prices"]
        (run,) = engine.capture(names)
        assert run.state == "succeeded", run.error
        tools.sql(
            tmp_path,
            "INSERT INTO log VALUES (3, 30, 'c'); UPDATE log SET v = 'B', seq = 40 WHERE id = 2;"
            "DELETE FROM prices WHERE id = 1; UPDATE prices SET p = 3.0 WHERE id = 2;",
        )
        (run,) = engine.capture(names)
        assert run.state == "succeeded", run.error
        assert _rows(engine, "SELECT id, v FROM shop.log ORDER BY id") == [
            {"id": 1, "v": "a"},
            {"id": 2, "v": "B"},
            {"id": 3, "v": "c"},
        ]
        assert _rows(
            engine, "SELECT page, count(*) AS n FROM shop.clicks GROUP BY page ORDER BY page"
        ) == [{"page": "cart", "n": 2}, {"page": "home", "n": 4}]
        assert _rows(engine, "SELECT id, p FROM shop.prices") == [{"id": 2, "p": 3.0}]
    finally:
        engine.close()


@ON_EVERY_STORE
def test_quarantine_holds_duplicates_in_the_lake_and_a_discard_deletes_them(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    extra = "      people:\n        key: [id]\n        quarantine: {reader: oncall}\n"
    project = _project(tmp_path, tools, lake_url, extra)
    tools.sql(
        tmp_path,
        "CREATE TABLE people (id INTEGER, name TEXT);"
        "INSERT INTO people VALUES (1, 'a'), (2, 'b'), (2, 'c'), (3, 'd');",
    )
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.people"])
        assert run.state == "needs_review", run.error
        (entry,) = engine.quarantine()
        assert entry["path"].startswith(f"{engine.layout.store.root}/_quarantine/shop/people/")
        _, held = engine.quarantine_records(entry["id"], limit=0)
        assert sorted(held.column("name").to_pylist()) == ["b", "c"]
        # a second capture of the same rows is not held twice
        (again,) = engine.capture(["shop.people"])
        assert again.state == "needs_review"
        assert [e["id"] for e in engine.quarantine()] == [entry["id"]]
        engine.decide_quarantine(entry["id"], "discarded", by="ana", reason="source fixed")
        assert not engine.layout.store.exists(entry["path"])
    finally:
        engine.close()


@ON_EVERY_STORE
def test_a_deleted_catalog_is_rebuilt_from_the_lake(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    """Versions, MAR and checkpoints come back from the lake's commits once declared again."""
    project = _project(tmp_path, tools, lake_url)
    engine = Engine.open(project)
    try:
        engine.capture()
        tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 3;")
        engine.capture()
        before = [(v["id"], v["row_count"]) for v in engine.history("shop.orders")]
        usage = _billed(engine)
    finally:
        engine.close()
    (tmp_path / ".combined" / "catalog.db").unlink()
    engine = Engine.open(project)
    try:
        (run,) = engine.capture()  # nothing changed: it only re-admits what the lake holds
        assert run.state == "succeeded", run.error
        assert engine.run(run.id)["deliveries"] == []
        assert [(v["id"], v["row_count"]) for v in engine.history("shop.orders")] == before
        assert _billed(engine) == usage
        assert _rows(engine, "SELECT count(*) AS n FROM shop.orders WHERE status = 'shipped'") == [
            {"n": 3}
        ]
    finally:
        engine.close()


@ON_EVERY_STORE
@pytest.mark.parametrize("boundary", ["after_commit"])
def test_a_commit_a_killed_run_made_is_projected_from_the_raw_layer(
    tmp_path: Path, tools: Any, lake_url: str, boundary: str
) -> None:
    """The raw layer is completed and MAR billed from the lake's Deliveries after a crash."""
    import signal

    _project(tmp_path, tools, lake_url)
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(tmp_path, "UPDATE orders SET status = 'shipped' WHERE id <= 10;")
    killed = tools.cli(tmp_path, "capture", env={"COMBINED_FAULT": boundary})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    repaired = tools.cli(tmp_path, "repair")
    assert repaired.returncode == 0, repaired.stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert [v["updates"] for v in engine.history("shop.orders")] == [0, 10]
        (usage,) = [u for u in engine.usage() if u["dataset"] == "orders"]
        assert usage["updates"] == 10
        store = engine.layout.store
        info = engine.run(engine.history("shop.orders")[-1]["run_id"])
        for d in info["deliveries"]:
            assert d.state == "committed"
            assert store.exists(d.path) and store.sha256(d.path) == d.content_hash
    finally:
        engine.close()
    assert os.environ.get("COMBINED_FAULT") is None


@ON_EVERY_STORE
def test_a_rewrite_commit_survives_the_loss_of_the_machine_that_made_it(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    """A merge's Deliveries are in the raw layer before its commit, not only after.

    Killed past its lake commit, the Run's staging then lost with its machine
    (a worker's disk, a pod's volume): a merge rewrites the table's rows, so
    no table file holds its Deliveries byte for byte. Before, the raw layer
    could not be completed and every later capture and repair failed ("restore
    the files into the raw layer from a backup").
    """
    import shutil
    import signal

    _project(tmp_path, tools, lake_url)
    assert tools.cli(tmp_path, "capture").returncode == 0
    tools.sql(
        tmp_path,
        "UPDATE orders SET status = 'lost' WHERE id <= 10; DELETE FROM orders WHERE id > 195;",
    )
    killed = tools.cli(tmp_path, "capture", env={"COMBINED_FAULT": "after_commit"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    staging = (
        tmp_path / ".combined" / "staging" if "://" in lake_url else tmp_path / "lake" / "_staging"
    )
    shutil.rmtree(staging)
    repaired = tools.cli(tmp_path, "repair")
    assert repaired.returncode == 0, repaired.stderr
    tools.sql(tmp_path, "UPDATE orders SET status = 'after' WHERE id = 20;")
    assert tools.cli(tmp_path, "capture").returncode == 0
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        changes = [(v["updates"], v["deletes"]) for v in engine.history("shop.orders")]
        assert changes == [(0, 0), (10, 5), (1, 0)]
        lost = "SELECT count(*) AS n FROM shop.orders WHERE status = 'lost'"
        assert _rows(engine, lost) == [{"n": 10}]
        (usage,) = [u for u in engine.usage() if u["dataset"] == "orders"]
        assert (usage["updates"], usage["deletes"]) == (11, 5)
        store = engine.layout.store
        for version in engine.history("shop.orders"):
            for d in engine.run(version["run_id"])["deliveries"]:
                assert d.state == "committed"
                assert store.exists(d.path) and store.sha256(d.path) == d.content_hash
    finally:
        engine.close()


@pytest.mark.parametrize("lake_url", ["s3"], indirect=True)
def test_a_store_setting_only_the_delta_library_reads_is_refused_before_any_run(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    """``AWS_ALLOW_HTTP=maybe`` passed the write probe (Arrow's client ignores it), then
    failed the Run's first lake write: exit 2 after the Run started, the Run left
    ``queued`` until a repair (found by an object-store review)."""
    _project(tmp_path, tools, lake_url)
    assert tools.cli(tmp_path, "capture").returncode == 0
    refused = tools.cli(tmp_path, "capture", env={"AWS_ALLOW_HTTP": "maybe"})
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert "cannot be written: a setting of the store in the environment is not valid" in said
    assert "nothing was captured" in said and "could not be projected" not in said
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert [r.state for r in engine.runs()] == ["succeeded"]
    finally:
        engine.close()


def test_a_file_url_lake_is_the_local_directory_it_names(tmp_path: Path, tools: Any) -> None:
    """``lake: file:///...`` was refused as an unsupported scheme."""
    lake = tmp_path / "elsewhere" / "lake"
    engine = Engine.open(_project(tmp_path, tools, lake.as_uri()))
    try:
        assert engine.project.lake_uri() == str(lake)
        (run,) = engine.capture(["shop.customers"])
        assert run.state == "succeeded", run.error
        assert (lake / "shop" / "customers" / "_delta_log").is_dir()
        assert _rows(engine, "SELECT count(*) AS n FROM shop.customers") == [{"n": 20}]
    finally:
        engine.close()


@ON_EVERY_STORE
def test_a_drift_held_in_quarantine_is_a_whole_file_of_the_lake(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    project = _project(tmp_path, tools, lake_url)
    project.write_text(
        project.read_text().replace(
            "      orders:\n        key: [id]\n",
            "      orders:\n        key: [id]\n        drift: {drop: quarantine}\n",
        )
    )
    engine = Engine.open(project)
    try:
        (first,) = engine.capture(["shop.orders"])
        assert first.state == "succeeded", first.error
        tools.sql(tmp_path, "ALTER TABLE orders DROP COLUMN total;")
        (held,) = engine.capture(["shop.orders"])
        assert held.state == "needs_review", held.error
        (entry,) = engine.quarantine()
        assert entry["record_count"] == 200
        _, records = engine.quarantine_records(entry["id"], limit=5)
        assert records.num_rows == 5 and "total" not in records.column_names
        engine.decide_quarantine(entry["id"], "released", by="ana", reason="expected")
        assert engine.layout.store.exists(entry["path"])  # kept as evidence
    finally:
        engine.close()


CDC_PROJECT = """\
version: 1
lake: {lake}
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
"""


@ON_EVERY_STORE
def test_cdc_lands_every_change_once_and_keeps_unchanged_toast_values(
    tmp_path: Path, cdc_db: Any, lake_url: str
) -> None:
    """The stream's unchanged out-of-line values are read back from the lake's current rows."""
    import psycopg

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, body text, tags text[])")
        conn.execute("ALTER TABLE items ALTER COLUMN tags SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO items SELECT g, g, NULL, NULL FROM generate_series(1, 100) g")
    cdc_db.slot("public.items")
    project = tmp_path / "combined.yaml"
    project.write_text(CDC_PROJECT.format(lake=lake_url, dsn=cdc_db.dsn, prefix=cdc_db.prefix))

    def source() -> list[tuple[Any, ...]]:
        with psycopg.connect(cdc_db.dsn) as conn:
            return list(conn.execute("SELECT id, qty, body, tags FROM items ORDER BY id"))

    engine = Engine.open(project)
    try:
        lake = "SELECT id, qty, body, tags FROM pg.items ORDER BY id"
        for change in (
            None,
            "UPDATE items SET body = repeat('x', 20000) WHERE id = 7;"
            # (a list filled from the lake is read by Arrow through the store)
            "UPDATE items SET tags = (SELECT array_agg(i::text) FROM generate_series(1, 3000) i) "
            "WHERE id IN (7, 8);"
            "DELETE FROM items WHERE id > 95; INSERT INTO items VALUES (500, 1, NULL)",
            "UPDATE items SET qty = 1000 WHERE id IN (7, 8)",  # body, tags out of line, unchanged
        ):
            if change:
                with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
                    for statement in change.split(";"):
                        conn.execute(statement)
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            assert [tuple(r.values()) for r in _rows(engine, lake)] == source()
    finally:
        engine.close()


@ON_EVERY_STORE
def test_a_range_backfill_reconciles_its_control_totals_against_the_lake(
    tmp_path: Path, pg_database: str, lake_url: str
) -> None:
    """The control totals are summed over the lake's files, wherever they are."""
    import psycopg

    from combined.catalog import data as cat

    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, total numeric(12,2))")
        conn.execute("INSERT INTO orders SELECT g, g * 0.25 FROM generate_series(1, 1000) g")
    project = tmp_path / "combined.yaml"
    project.write_text(
        f"version: 1\nlake: {lake_url}\nsources:\n  pg:\n    connector: postgres\n"
        f"    config:\n      dsn: {pg_database}\n    datasets:\n      orders:\n"
        "        relation: public.orders\n        key: [id]\n"
    )
    engine = Engine.open(project)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("DELETE FROM orders WHERE id BETWEEN 100 AND 149")
        run = engine.backfill(
            "pg.orders", partitions=2, lower="100", upper="200", sum_column="total"
        )
        assert run.state == "succeeded", run.error
        with engine.catalog.begin() as conn:
            events = cat.activity(conn, kind="reconciliation.control")
        assert events and all(e.body["ok"] for e in events)
        assert events[0].body["landed"]["rows"] == events[0].body["control"]["rows"] == 50
        assert _rows(engine, "SELECT count(*) AS n FROM pg.orders") == [{"n": 950}]
    finally:
        engine.close()


@ON_EVERY_STORE
def test_a_widened_column_rewrites_the_history_in_its_new_type(
    tmp_path: Path, tools: Any, lake_url: str
) -> None:
    # The history's rows are read back through the store's own Arrow
    # filesystem (LakeStore.dataset) and rewritten in the widened type.
    history = (  # (an integer made a float is accepted, not a widening: its texts change)
        "      orders:\n        key: [id]\n        history: true\n"
        "        drift: {narrowed_type: evolve}\n"
    )
    project = _project(tmp_path, tools, lake_url)
    project.write_text(project.read_text().replace("      orders:\n        key: [id]\n", history))
    engine = Engine.open(project)
    try:
        (first,) = engine.capture(["shop.orders"])
        assert first.state == "succeeded", first.error
        tools.sql(
            tmp_path,
            "CREATE TABLE o2 (id INTEGER PRIMARY KEY, customer_id REAL, status TEXT, total REAL);"
            "INSERT INTO o2 SELECT * FROM orders; DROP TABLE orders;"
            "ALTER TABLE o2 RENAME TO orders; UPDATE orders SET customer_id = 2.5 WHERE id = 2;",
        )
        (widened,) = engine.capture(["shop.orders"])
        assert widened.state == "succeeded", widened.error
        versions = _rows(
            engine,
            "SELECT customer_id AS c, _combined_is_current AS current FROM shop.orders__history "
            "WHERE id = 2 ORDER BY _combined_valid_from",
        )
        assert versions == [{"c": 3.0, "current": False}, {"c": 2.5, "current": True}]
        current = "SELECT count(*) AS n FROM shop.orders__history WHERE _combined_is_current"
        assert _rows(engine, current) == [{"n": 200}]
    finally:
        engine.close()
