"""The catalog on PostgreSQL behaves like the SQLite one; no catalog ever holds a secret."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from combined.catalog._catalog import _head_revision
from combined.engine import Engine


def _lake_rows(engine: Engine, table: str, cols: str) -> list[tuple[object, ...]]:
    result = engine.sql(f"SELECT {cols} FROM {table} ORDER BY id")
    return [tuple(r.values()) for r in result.to_pylist()]


def test_capture_with_a_postgresql_catalog(tmp_path: Path, tools: Any, pg_database: str) -> None:
    project = tools.make(tmp_path, catalog=pg_database)  # the URL a user writes
    engine = Engine.open(project)
    try:
        (first,) = engine.capture()
        assert first.state == "succeeded", first.error
        tools.sql(
            tmp_path,
            "UPDATE orders SET status = 'shipped' WHERE id <= 3;"
            "DELETE FROM orders WHERE id = 200;"
            "INSERT INTO orders VALUES (900, 2, 'placed', 9.0);",
        )
        (second,) = engine.capture()
        assert second.state == "succeeded", second.error
        assert second.stats is not None
        assert second.stats["orders"]["inserts"] == 1
        assert second.stats["orders"]["updates"] == 3
        assert second.stats["orders"]["deletes"] == 1

        assert [r.id for r in engine.runs()] == [second.id, first.id]
        pubs = engine.publications()
        assert [p["id"] for p in pubs] == [second.publication_id, first.publication_id]
        history = engine.history("shop.orders")
        assert len(history) == 2
        newest = next(v for v in history if v["run_id"] == second.id)
        oldest = next(v for v in history if v["run_id"] == first.id)
        assert newest["parent_id"] == oldest["id"]
        assert second.publication_id in newest["publications"]

        assert _lake_rows(engine, "shop.orders", "id, customer_id, status, total") == [
            tuple(r) for r in tools.rows(tmp_path, "orders")
        ]
        assert _lake_rows(engine, "shop.customers", "id, name, city") == [
            tuple(r) for r in tools.rows(tmp_path, "customers")
        ]
        # the earlier publication still answers with the earlier state
        earlier = engine.sql(
            "SELECT count(*) AS n FROM shop.orders", publication=first.publication_id
        )
        assert earlier.to_pylist() == [{"n": 200}]
    finally:
        engine.close()
    # nothing lives in a local SQLite catalog: the catalog really is PostgreSQL
    assert not (tmp_path / ".combined" / "catalog.db").exists()


def test_a_postgres_scheme_catalog_is_postgresql(
    tmp_path: Path, tools: Any, pg_database: str
) -> None:
    # libpq reads postgres:// as postgresql://, and so does Combined
    catalog = pg_database.replace("postgresql://", "postgres://", 1)
    tools.make(tmp_path, catalog=catalog)
    result = tools.cli(tmp_path, "capture")
    assert result.returncode == 0, result.stderr
    assert "succeeded" in result.stdout
    assert not (tmp_path / ".combined" / "catalog.db").exists()


SECRET = "s3cr3t-Value-42"


@pytest.mark.parametrize(
    ("catalog", "message"),
    [
        # psycopg refuses the option before any connection is tried: no server needed
        (
            "postgresql://combined@127.0.0.1:1/nodb?foo=bar",
            "cannot open the catalog at postgresql://combined:***@127.0.0.1:1/nodb?foo=bar: "
            'invalid connection option "foo"',
        ),
        (
            "postgres://combined@127.0.0.1:1/nodb?sslmode=bogus",
            'invalid sslmode value: "bogus"',
        ),
    ],
)
def test_a_connection_option_the_driver_refuses_is_a_clear_error(
    tmp_path: Path, tools: Any, catalog: str, message: str
) -> None:
    project = tools.make(tmp_path, catalog=catalog)
    project.write_text(project.read_text() + 'catalog_password: {secret: "env:CATALOG_PW"}\n')
    result = tools.cli(tmp_path, "capture", env={"CATALOG_PW": SECRET})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "hint: check `catalog:` in combined.yaml" in result.stderr
    assert "Traceback" not in result.stderr and SECRET not in result.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite+foo:///x.db", "the catalog URL sqlite+foo:///x.db has an unsupported scheme"),
        ("mysql://u@h/db", "has an unsupported scheme or driver"),
        ("postgresql://u:hunter2@h:abc/db", "postgresql://u:***@h:abc/db is malformed"),
    ],
)
def test_a_catalog_url_that_cannot_be_used_is_a_catalog_error(url: str, message: str) -> None:
    from combined.catalog import Catalog
    from combined.errors import CatalogError

    with pytest.raises(CatalogError) as info:
        Catalog.open(url)
    assert message in info.value.message
    assert info.value.hint and "sqlite:///PATH or postgresql://" in info.value.hint
    assert "hunter2" not in info.value.describe()


def test_the_catalog_and_lake_never_hold_a_secret(
    shop: Path, tools: Any, monkeypatch: pytest.MonkeyPatch, pg_database: str
) -> None:
    import psycopg

    # A source that takes a password (SQLite takes none): the server may not
    # ask for it, but the engine resolves it and hands it to the connector.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO customers VALUES (1, 'a'), (2, 'b')")
    monkeypatch.setenv("SHOP_PW", SECRET)
    tools.add_pg_source(shop, "crm", pg_database, "SHOP_PW")
    engine = Engine.open(shop / "combined.yaml")
    try:
        runs = engine.capture()
        assert [run.state for run in runs] == ["succeeded", "succeeded"], runs[-1].error
        # the reference itself is recorded: the config really reached the catalog
        admission = engine.run(runs[-1].id)["admission"]
        assert admission.config["config"]["password"] == {"secret": "env:SHOP_PW"}
    finally:
        engine.close()

    dumped: list[str] = []
    con = sqlite3.connect(shop / ".combined" / "catalog.db")
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert "runs" in tables or any("run" in t for t in tables)
        for table in tables:
            for row in con.execute(f'SELECT * FROM "{table}"'):
                dumped.append(repr(row))
    finally:
        con.close()
    catalog_text = "\n".join(dumped)
    assert "env:SHOP_PW" in catalog_text  # the dump did see the source configuration
    assert SECRET not in catalog_text

    logs = list((shop / "lake").rglob("_delta_log/*.json"))
    assert logs
    for log in logs:
        assert SECRET not in log.read_text()
    for path in (shop / "lake").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_a_catalog_at_the_newest_revision_opens_without_alembic(tmp_path: Path) -> None:
    import subprocess
    import sys

    from combined.catalog import Catalog
    from combined.catalog._catalog import _head_revision

    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    Catalog.open(url).close()  # a new catalog: the schema module, stamped at the head
    with sqlite3.connect(tmp_path / "catalog.db") as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (_head_revision(),)
        ]
    code = (
        "import sys; from combined.catalog import Catalog; "
        f"Catalog.open({url!r}).close(); print('alembic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    # A catalog behind the newest revision still goes through Alembic.
    with sqlite3.connect(tmp_path / "catalog.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'older'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "older" in out.stderr  # Alembic refuses a revision it does not know


def _schema_of(url: str) -> dict[str, Any]:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        return {
            name: (
                [(c["name"], str(c["type"]), c["nullable"], c["default"]) for c in cols],
                inspector.get_pk_constraint(name),
                sorted(inspector.get_indexes(name), key=lambda i: str(i["name"])),
                inspector.get_foreign_keys(name),
                inspector.get_unique_constraints(name),
            )
            for name in sorted(inspector.get_table_names())
            for cols in [inspector.get_columns(name)]
        }
    finally:
        engine.dispose()


def test_a_new_catalog_has_the_schema_the_migrations_build(tmp_path: Path) -> None:
    # A new catalog is created from the schema module without Alembic; the
    # migrations must build the very same schema, at the same revision.
    import subprocess
    import sys

    from alembic import command
    from alembic.config import Config

    from combined.catalog._catalog import _MIGRATIONS

    direct = f"sqlite:///{tmp_path / 'direct.db'}"
    code = (
        "import sys; from combined.catalog import Catalog; "
        f"Catalog.open({direct!r}).close(); print('alembic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # created without loading Alembic

    migrated = f"sqlite:///{tmp_path / 'migrated.db'}"
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", migrated)
    import sqlalchemy as sa

    engine = sa.create_engine(migrated)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    engine.dispose()

    assert _schema_of(direct) == _schema_of(migrated)
    for name in ("direct.db", "migrated.db"):
        with sqlite3.connect(tmp_path / name) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
                (_head_revision(),)
            ]
    # ... and a catalog that already holds some of it is left to Alembic.
    partial = tmp_path / "partial.db"
    with sqlite3.connect(partial) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    code = code.replace(direct, f"sqlite:///{partial}")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    assert _schema_of(f"sqlite:///{partial}").keys() == _schema_of(direct).keys()


def _upgraded_from_0001(url: str) -> None:
    """Build a revision-0001 catalog at ``url`` holding a queued Run, then open it.

    Revision 0002 added the queue. A Run of an older catalog was admitted by
    the process that executed it: after the upgrade it must not wait for a
    worker forever, and recovery must close it as it did before.
    """
    from datetime import timedelta

    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    from combined.catalog import Catalog, queue
    from combined.catalog import runs as runs_repo
    from combined.catalog._catalog import _MIGRATIONS, _engine_url

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    engine = sa.create_engine(_engine_url(url))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
        conn.execute(
            sa.text(
                "INSERT INTO admissions VALUES ('a1', 'sqlite', '1', 'd', '{}', 'standard', "
                "'embedded', '2026-01-01 00:00:00.000000')"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO runs (id, source, datasets, trigger, state, admission_id, "
                "created_at) VALUES ('r1', 'shop', '[\"orders\"]', 'manual', 'queued', 'a1', "
                "'2026-01-01 00:00:00.000000')"
            )
        )
    engine.dispose()
    catalog = Catalog.open(url)  # upgraded to the newest revision
    try:
        with catalog.begin() as conn:
            run = runs_repo.get_run(conn, "r1")
            assert run.claimed_by == "" and run.claimed_at == run.created_at
            assert queue.queued(conn) == []
            assert queue.take(conn, "someone") is None
            version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
            assert [tuple(v) for v in version] == [(_head_revision(),)]
        assert not queue.taker_live(run, timedelta(seconds=300))
    finally:
        catalog.close()


def test_runs_of_a_sqlite_catalog_older_than_the_queue_do_not_wait_for_a_worker(
    tmp_path: Path,
) -> None:
    _upgraded_from_0001(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_runs_of_a_postgresql_catalog_older_than_the_queue_do_not_wait_for_a_worker(
    pg_database: str,
) -> None:
    _upgraded_from_0001(pg_database)


def test_processes_opening_one_new_sqlite_catalog_at_once_all_succeed(tmp_path: Path) -> None:
    # Workers started together on a new project: the SQLite driver ran each
    # CREATE TABLE on its own, so the second process saw half a schema.
    import subprocess
    import sys

    code = "import sys; from combined.catalog import Catalog; Catalog.open(sys.argv[1]).close()"
    for i in range(4):
        url = f"sqlite:///{tmp_path / f'new{i}.db'}"
        procs = [
            subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE, text=True)
            for _ in range(3)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        with sqlite3.connect(tmp_path / f"new{i}.db") as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
                (_head_revision(),)
            ]


def test_a_catalog_opened_while_another_connection_writes_it_waits_for_the_write(
    tmp_path: Path,
) -> None:
    # Switching a file to WAL needs it to itself, and SQLite answers "database
    # is locked" at once while another connection holds a write lock, without
    # waiting: a worker opening the catalog while another created it failed.
    import threading

    from combined.catalog import Catalog

    path = tmp_path / "busy.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE other (x)")  # a file in the rollback journal's mode
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO other VALUES (1)")
    release = threading.Timer(0.5, writer.execute, ["COMMIT"])
    release.start()
    try:
        Catalog.open(f"sqlite:///{path}").close()
    finally:
        release.join()
        writer.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (_head_revision(),)
        ]


def _at_0001(url: str) -> None:
    """Build a catalog at revision 0001 (before the queue) at ``url``."""
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    from combined.catalog._catalog import _MIGRATIONS, _engine_url

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    engine = sa.create_engine(_engine_url(url))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
    engine.dispose()


def _open_together(url: str, hold: Any, release: Any, processes: int = 3) -> None:
    """Open the catalog at ``url`` in ``processes`` processes while ``hold`` blocks them.

    ``hold()`` takes a lock the upgrade needs and returns once every process
    waits on it; ``release()`` lets them go. Each process must open the
    catalog, upgraded once, at the newest revision.
    """
    import subprocess
    import sys

    code = "import sys; from combined.catalog import Catalog; Catalog.open(sys.argv[1]).close()"
    procs = hold(
        lambda: [
            subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE, text=True)
            for _ in range(processes)
        ]
    )
    release()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err


def test_processes_upgrading_one_sqlite_catalog_at_once_all_succeed(tmp_path: Path) -> None:
    # Workers restarted together on a newer Combined: each read revision 0001
    # and added the queue's columns, and all but the first failed with
    # "cannot open the catalog: duplicate column name: claimed_by".
    import time

    for i in range(3):
        path = tmp_path / f"old{i}.db"
        _at_0001(f"sqlite:///{path}")
        held = sqlite3.connect(path, isolation_level=None)
        held.execute("PRAGMA journal_mode=WAL")  # as every catalog Combined opened is

        def hold(start: Any, held: sqlite3.Connection = held) -> Any:
            held.execute("BEGIN IMMEDIATE")  # the upgrade's writes wait for it
            procs = start()
            time.sleep(3)  # each process reads the revision, then waits to write
            return procs

        def release(held: sqlite3.Connection = held) -> None:
            held.execute("ROLLBACK")
            held.close()

        _open_together(f"sqlite:///{path}", hold, release, processes=4)
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
                (_head_revision(),)
            ]


@pytest.mark.postgres
def test_processes_upgrading_one_postgresql_catalog_at_once_all_succeed(
    pg_database: str,
) -> None:
    # Each process read revision 0001, then waited for the first one's
    # ALTER TABLE: all but that one failed with "column claimed_by of
    # relation runs already exists".
    import time

    import psycopg

    _at_0001(pg_database)
    held = psycopg.connect(pg_database)

    def hold(start: Any) -> Any:
        held.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        procs = start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with psycopg.connect(pg_database, autocommit=True) as watcher:
                waiting = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type IN ('Lock', 'Advisory')"
                ).fetchone()
            if waiting is not None and waiting[0] == len(procs):
                break
            time.sleep(0.1)
        return procs

    def release() -> None:
        held.rollback()
        held.close()

    _open_together(pg_database, hold, release)
    with psycopg.connect(pg_database) as conn:
        version = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    assert version == [(_head_revision(),)]
