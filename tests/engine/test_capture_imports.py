"""What a capture process imports: nothing it does not use; and what its exit costs.

Every module a ``combined capture`` loads stays resident for the whole
process, so it adds to every capture's peak memory. ADBC's DB-API module
imported polars whenever polars was installed (about 50 MB), a snapshot
capture loaded change capture's modules (psycopg2, the WAL decoder), and a
change capture that streams from its slot loaded psycopg2, which only
creates slots (~80 ms of CPU a capture: a third libpq and OpenSSL).
These tests run the real command in a fresh process and read its
``sys.modules`` at the end; they bound names, not bytes, so they hold on any
machine. The last one counts the objects the interpreter's exit would
collect one by one (0.15-0.35 CPU-s after a capture, issue 25).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

# Run the command as the `combined` script does, then report what was loaded.
_PROBE = """
import json, sys
from combined.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code
print("MODULES", json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""

# The same, reporting from the last exit handler (registered first, it runs
# last) how many objects the collector still tracks: what the interpreter's
# teardown would go through.
_EXIT_PROBE = """
import atexit, gc, json
atexit.register(lambda: print("TRACKED", json.dumps(len(gc.get_objects()))))
from combined.cli import main
main()
"""

#: Modules no capture needs; each costs megabytes or a noticeable import time.
NOT_FOR_A_CAPTURE = (
    "polars",  # through adbc_driver_manager.dbapi when it is installed
    "adbc_driver_manager.dbapi",
    "pyarrow.dataset",  # imported by the DB-API on first use
    "pandas",
    "psycopg2",  # change capture's replication connection
    "combined.connectors.postgres._cdc",
    "combined.connectors.postgres._walstream",
    "sqlalchemy.dialects.postgresql",  # a SQLite catalog's capture
    "alembic",
    "fastapi",
    "starlette",
    "uvicorn",
    "jinja2",
)

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
        cursor:
          column: id
          trust: "events.id is a bigserial assigned on insert"
"""


def _capture(root: Path, *selectors: str) -> set[str]:
    """Run ``combined capture`` in a fresh process; the modules it had loaded at the end."""
    env = {**os.environ, "COMBINED_RETRY_BACKOFF_S": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, "capture", *selectors],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES ")), None)
    assert line is not None, proc.stdout + proc.stderr
    report = json.loads(line.removeprefix("MODULES "))
    assert report["code"] in (0, None), proc.stdout + proc.stderr
    return set(report["modules"])


def _unneeded(modules: set[str]) -> list[str]:
    return sorted(name for name in NOT_FOR_A_CAPTURE if name in modules)


def test_a_postgres_capture_imports_neither_polars_nor_change_capture(
    tmp_path: Path, pg_database: str
) -> None:
    # The defect only shows where polars is installed (the dev extra installs it).
    assert importlib.util.find_spec("polars") is not None, "install the dev extra (polars)"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text, total numeric(10,2))")
        conn.execute(
            "INSERT INTO orders SELECT g, 'n' || g, g * 1.5 FROM generate_series(1, 500) g"
        )
        conn.execute("CREATE TABLE events (id bigserial PRIMARY KEY, kind text)")
        conn.execute("INSERT INTO events (kind) SELECT 'e' || g FROM generate_series(1, 50) g")
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=pg_database))

    first = _capture(tmp_path)
    assert "combined.connectors.postgres._extract" in first  # it did read through the connector
    assert _unneeded(first) == []

    # A changed re-capture: the keyed commit's rewrite, deletes, a cursor page.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("UPDATE orders SET note = 'changed' WHERE id % 10 = 0")
        conn.execute("DELETE FROM orders WHERE id > 490")
        conn.execute("INSERT INTO events (kind) VALUES ('late')")
    again = _capture(tmp_path)
    assert _unneeded(again) == []


def test_a_sqlite_capture_does_not_import_polars(shop: Path) -> None:
    assert importlib.util.find_spec("polars") is not None, "install the dev extra (polars)"
    modules = _capture(shop)
    assert "combined.connectors.sqlite._extraction" in modules
    assert _unneeded(modules) == []


@pytest.mark.parametrize("source", ["postgres", "sqlite"])
def test_the_connectors_import_no_dbapi(source: str) -> None:
    # The connector modules alone, in a fresh interpreter: no DB-API, no polars.
    code = (
        f"import sys, combined.connectors.{source}; "
        "print(sorted(m for m in ('polars', 'adbc_driver_manager.dbapi') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


def _cdc_backlog(root: Path, cdc_db, tools) -> None:
    """A cdc dataset set up (its slot, its stitched snapshot), then a backlog of changes."""
    cdc_db.slot("public.items")  # dropped after the test
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, qty int, note text)")
        conn.execute("INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 300) g")
    (root / "combined.yaml").write_text(
        tools.pg_cdc_project(cdc_db.dsn, cdc_db.prefix, "public.items", ["id"])
    )
    setup = tools.cli(root, "cdc", "setup", "pg")
    assert setup.returncode == 0, setup.stderr
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET qty = qty + 1 WHERE id <= 30")
        conn.execute("DELETE FROM items WHERE id > 290")


def test_a_change_capture_does_not_import_polars(tmp_path: Path, cdc_db, tools) -> None:
    assert importlib.util.find_spec("polars") is not None, "install the dev extra (polars)"
    _cdc_backlog(tmp_path, cdc_db, tools)
    modules = _capture(tmp_path)
    assert "combined.connectors.postgres._cdc" in modules  # it drained the stream
    needed = {"combined.connectors.postgres._cdc", "combined.connectors.postgres._walstream"}
    assert [name for name in _unneeded(modules) if name not in needed] == []


def test_a_capture_streaming_from_its_slot_does_not_import_psycopg2(
    tmp_path: Path, cdc_db, tools
) -> None:
    # psycopg2 creates slots (cdc setup, a first capture); a stream needs psycopg 3 alone.
    _cdc_backlog(tmp_path, cdc_db, tools)
    modules = _capture(tmp_path)
    assert "combined.connectors.postgres._walstream" in modules  # it streamed
    assert "psycopg2" not in modules
    with psycopg.connect(cdc_db.dsn) as conn:
        lsn = conn.execute(
            "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
            (cdc_db.slot("public.items"),),
        ).fetchone()
    assert lsn is not None and lsn[0] is not None  # confirmed after the lake's commit


def test_a_capture_leaves_its_objects_to_the_system_at_exit(tmp_path: Path, cdc_db, tools) -> None:
    # Every object a capture leaves (modules, classes, caches: ~110,000 after
    # this one) was torn down one by one by the interpreter's exit.
    _cdc_backlog(tmp_path, cdc_db, tools)
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_PROBE, "capture"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TRACKED ")), None)
    assert line is not None, proc.stdout + proc.stderr
    assert json.loads(line.removeprefix("TRACKED ")) < 5_000
    rows = tools.cli(tmp_path, "sql", "SELECT count(*) AS n, sum(qty) AS q FROM pg.items")
    assert rows.returncode == 0, rows.stderr
    with psycopg.connect(cdc_db.dsn) as conn:
        n, q = conn.execute("SELECT count(*), sum(qty) FROM items").fetchone() or (0, 0)
    assert str(n) in rows.stdout and str(q) in rows.stdout  # the lake equals the source
