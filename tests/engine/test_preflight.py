"""Configuration problems are refused before any Run (exit 2), not as retryable failed Runs.

Each of these became a Run that ended ``failed`` (exit 1, "retry later"),
which a retry met again; `combined check` passed most of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg
import pymysql
import pytest
from tests.connectors.postgres._cluster import private_cluster
from tests.connectors.singer.fixtures import EVENTS, TAPS, TOKEN, USERS, write_data
from tests.engine.test_singer_capture import PROJECT as SINGER_PROJECT

from combined.connectors.mariadb._connect import Settings as MariaSettings
from combined.engine import Engine


def _pg(root: Path, dsn: str, datasets: str) -> None:
    """A project of one PostgreSQL source ``pg`` with ``datasets`` (YAML, indented 6)."""
    head = "version: 1\nlake: ./lake\nsources:\n  pg:\n    connector: postgres\n"
    # (slots of the test's own prefix: slot names are the server's, shared by tests)
    prefix = "c_" + dsn.split("\n")[0].rsplit("/", 1)[-1].split("?")[0]
    body = (
        f"    config:\n      dsn: {dsn}\n      slot_prefix: {prefix}\n    datasets:\n{datasets}\n"
    )
    (root / "combined.yaml").write_text(head + body)


def _no_runs(root: Path) -> None:
    engine = Engine.open(root / "combined.yaml")
    try:
        assert engine.runs() == []
    finally:
        engine.close()


def _refused(root: Path, tools, *args: str, says: str) -> None:
    result = tools.cli(root, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert says in " ".join(result.stderr.split()), result.stderr
    _no_runs(root)


def test_an_invalid_sslmode_is_refused_before_a_run(
    tmp_path: Path, pg_database: str, tools
) -> None:
    """Reproduction: dsn ...?sslmode=bogus; `combined capture` retried the connection
    twice and ended failed (exit 1) with "cannot reach the postgres source" and a
    network hint."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    dsn = pg_database + ("&" if "?" in pg_database else "?") + "sslmode=bogus"
    datasets = "      t:\n        key: [id]"
    _pg(tmp_path, dsn, datasets)
    _refused(tmp_path, tools, "capture", says="sslmode is 'bogus', which libpq does not take")
    check = tools.cli(tmp_path, "check")
    assert check.returncode != 0 and "verify-full" in check.stdout + check.stderr


def test_a_keyless_cursor_append_dataset_is_refused_before_a_run(
    tmp_path: Path, pg_database: str, tools
) -> None:
    """Reproduction: an append dataset with a cursor and no key passed `combined check`,
    then every capture failed (exit 1) with "reads by cursor but declares no key"."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE ev (id int, at timestamptz, v int)")
        conn.execute("INSERT INTO ev VALUES (1, now(), 1)")
    datasets = (
        "      ev:\n        relation: public.ev\n        strategy: cursor\n"
        "        sync_mode: append\n"
        '        cursor: {column: at, trust: "set on insert"}'
    )
    _pg(tmp_path, pg_database, datasets)
    says = "sources.pg.datasets.ev reads by cursor but declares no key"
    _refused(tmp_path, tools, "capture", says=says)
    check = tools.cli(tmp_path, "check")
    assert check.returncode != 0 and says in " ".join(check.stdout.split())


def test_an_uncast_interval_column_is_refused_before_a_run(
    tmp_path: Path, pg_database: str, tools
) -> None:
    """Reproduction: a table with an `interval` column; `combined capture` read it and
    failed (exit 1, "retry later") on "month_day_nano_interval, which has no canonical
    identity encoding"; `combined check` said ok."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE iv (id int PRIMARY KEY, d interval, n int)")
        conn.execute("INSERT INTO iv VALUES (1, '1 day 2 hours', 1), (2, '3 months', 2)")
    datasets = "      iv:\n        key: [id]"
    _pg(tmp_path, pg_database, datasets)
    _refused(tmp_path, tools, "capture", says="column 'd' of 'public.iv' has type interval")
    result = tools.cli(tmp_path, "capture")
    assert 'declare casts: {"public.iv.d": "text"}' in " ".join(result.stderr.split())
    check = tools.cli(tmp_path, "check")
    assert check.returncode != 0 and "has type interval" in " ".join(check.stdout.split())
    # Left out of the dataset, the rest of the table reads.
    datasets += "\n        columns: [id, n]"
    _pg(tmp_path, pg_database, datasets)
    assert tools.cli(tmp_path, "capture").returncode == 0


def test_a_range_or_composite_column_is_refused_before_a_run_and_leaves_no_slot(
    tmp_path: Path, pg_database: str, tools
) -> None:
    """Reproduction: a `cdc` dataset over a table with an int4range column; the first
    capture created the publication and the replication slot, then ended needs_review
    on "no faithful arrow type for int4range", leaving both on the server (the slot
    retaining WAL); `combined check` said ok. A snapshot dataset over a composite
    column was the same needs_review Run that `check` had passed."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TYPE addr AS (street text, no int)")
        conn.execute("CREATE TABLE rg (id int PRIMARY KEY, r int4range, a addr, n int)")
        conn.execute("INSERT INTO rg VALUES (1, '[1,5)', ROW('main', 5), 1)")
    _pg(tmp_path, pg_database, "      rg:\n        key: [id]\n        strategy: cdc")
    says = "2 columns of 'public.rg' cannot be read as themselves: 'r' has type int4range"
    _refused(tmp_path, tools, "capture", says=f"{says}: no faithful arrow type for int4range; 'a'")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        slots = conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()"
        ).fetchall()
        pubs = conn.execute("SELECT pubname FROM pg_publication").fetchall()
    assert slots == [] and pubs == []
    check = tools.cli(tmp_path, "check")
    leave = 'leave them out with the dataset\'s `columns: ["id", "n"]`'
    assert check.returncode == 2 and leave in " ".join(check.stdout.split())
    _pg(tmp_path, pg_database, "      rg:\n        key: [id]\n        columns: [id, a, n]")
    says = "column 'a' of 'public.rg' has type addr"
    _refused(tmp_path, tools, "capture", says=says)
    result = tools.cli(tmp_path, "check")
    assert 'declare casts: {"public.rg.a": "text"}' in " ".join(result.stdout.split())
    # Cast, the composite reads as its text.
    _pg(
        tmp_path,
        pg_database + '\n      casts: {"public.rg.a": text}',
        "      rg:\n        key: [id]\n        columns: [id, a, n]",
    )
    assert tools.cli(tmp_path, "capture").returncode == 0


def test_every_unreadable_column_of_a_dataset_is_told_in_one_refusal(
    tmp_path: Path, pg_database: str, tools
) -> None:
    """Reproduction: a table of five columns Combined cannot read as themselves (a
    composite, a range, money, an interval, a tsvector); `combined check` named only
    'iv', then with it left out of `columns:` only 'p', and so on: five rounds of check
    and edit. One refusal now names them all, and its hint fixes them all at once."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TYPE pair AS (a int, b int)")
        conn.execute(
            "CREATE TABLE t (id int PRIMARY KEY, p pair, r int4range, m money, iv interval, "
            "ts tsvector, n int, g int GENERATED ALWAYS AS (n * 2) STORED)"
        )
        conn.execute("INSERT INTO t VALUES (1, ROW(1, 2), '[1,5)', 3.5, '1 day', 'a b', 7)")
    _pg(tmp_path, pg_database, "      t:\n        key: [id]")
    check = tools.cli(tmp_path, "check")
    said = " ".join(check.stdout.split())
    assert check.returncode == 2, said
    assert "dataset 't': 5 columns of 'public.t' cannot be read as themselves: 'p' has " in said
    for told in ("int4range", "money", "'iv' has type interval", "'ts' has type tsvector"):
        assert told in said
    casts = ", ".join(f'"public.t.{c}": "text"' for c in ("p", "r", "m", "iv", "ts"))
    assert f"declare casts: {{{casts}}} in the source configuration" in said
    assert 'leave them out with the dataset\'s `columns: ["id", "n", "g"]`' in said
    _refused(tmp_path, tools, "capture", says="5 columns of 'public.t' cannot be read")
    # Either fix, as the hint gives it, is one edit.
    _pg(tmp_path, pg_database + f"\n      casts: {{{casts}}}", "      t:\n        key: [id]")
    assert tools.cli(tmp_path, "check").returncode == 0
    _pg(tmp_path, pg_database, '      t:\n        key: [id]\n        columns: ["id", "n", "g"]')
    assert tools.cli(tmp_path, "capture").returncode == 0
    # A cdc dataset's list leaves out the generated column too, which its stream lacks.
    _pg(tmp_path, pg_database, "      t:\n        key: [id]\n        strategy: cdc")
    said = " ".join(tools.cli(tmp_path, "check").stdout.split())
    assert 'leave them out with the dataset\'s `columns: ["id", "n"]`, or capture them' in said
    _pg(
        tmp_path,
        pg_database,
        '      t:\n        key: [id]\n        columns: ["id", "n"]\n        strategy: cdc',
    )
    assert tools.cli(tmp_path, "check").returncode == 0


def test_a_backfill_of_a_mariadb_dataset_is_refused_before_a_run(
    tmp_path: Path, mariadb_database: str, tools
) -> None:
    """Reproduction: `combined backfill my.t --from 1 --to 10` on a MariaDB dataset
    admitted a Run that failed (exit 1) with "cannot read partitions"."""
    kwargs = MariaSettings.from_config({"dsn": mariadb_database}).connect_kwargs()
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE bt (id int PRIMARY KEY)")
    (tmp_path / "combined.yaml").write_text(
        "version: 1\nlake: ./lake\nsources:\n  my:\n    connector: mariadb\n"
        f"    config:\n      dsn: {mariadb_database}\n"
        "    datasets:\n      bt:\n        key: [id]\n"
    )
    says = "the mariadb connector cannot read partitions, so it takes no backfill"
    _refused(tmp_path, tools, "backfill", "my.bt", "--from", "1", "--to", "10", says=says)


def test_a_singer_cursor_on_a_stream_without_a_replication_key_is_refused_before_a_run(
    tmp_path: Path, tools, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reproduction: `strategy: cursor` on the tap's `events` stream, which declares no
    replication_key: the capture's Run failed (exit 1) and `combined check` said ok."""
    monkeypatch.setenv("COMBINED_TEST_SINGER_TOKEN", TOKEN)
    write_data(tmp_path / "data.json", USERS, EVENTS)
    (tmp_path / "combined.yaml").write_text(
        SINGER_PROJECT.format(
            python=json.dumps(sys.executable),
            tap=json.dumps(str(TAPS / "good_tap.py")),
            data=json.dumps(str(tmp_path / "data.json")),
            probe=json.dumps(str(tmp_path / "probe.jsonl")),
        ).split("    datasets:")[0]
        + "    datasets:\n      events:\n        key: [id]\n        strategy: cursor\n"
        + '        cursor: {column: id, trust: "ids grow"}\n'
    )
    says = "reads stream 'events' by cursor, but the stream has no replication_key"
    _refused(tmp_path, tools, "capture", says=says)
    check = tools.cli(tmp_path, "check")
    assert check.returncode != 0 and says in " ".join(check.stdout.split())


CURSOR = "\n        strategy: cursor\n        cursor: {{column: {}, trust: grows}}"


@pytest.mark.parametrize("column", ["name", "at_time"])
def test_a_postgres_cursor_no_read_can_order_is_refused_before_a_run(
    tmp_path: Path, pg_database: str, tools, column: str
) -> None:
    """Reproduction: a cursor on a `text` or `time` column; `combined check` said ok, and
    every capture failed (exit 1, "retry later") on "cannot serve as a cursor"."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE cur (id int PRIMARY KEY, name text, at_time time, n int)")
        conn.execute("INSERT INTO cur VALUES (1, 'a', '10:00', 1)")
    _pg(tmp_path, pg_database, "      cur:\n        key: [id]" + CURSOR.format(column))
    says = f"dataset 'cur': column {column!r}"
    _refused(tmp_path, tools, "capture", says=f"{says} (")
    check = tools.cli(tmp_path, "check")
    said = " ".join(check.stdout.split())
    assert check.returncode == 2 and "cannot serve as a cursor" in said, check.stdout
    _pg(tmp_path, pg_database, "      cur:\n        key: [id]" + CURSOR.format("n"))
    assert tools.cli(tmp_path, "check").returncode == 0


@pytest.mark.parametrize("key", ["j", "x", "dj"])
def test_a_postgres_cursor_keyed_by_a_column_without_an_ordering_is_refused_before_a_run(
    tmp_path: Path, pg_database: str, tools, key: str
) -> None:
    """Reproduction: a cursor dataset keyed by a `json`, `xml` (or a domain over `json`)
    column; `combined check` said ok, and every capture failed (exit 1, "retry later") on
    the server's "could not identify an ordering operator for type json"."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE DOMAIN dj AS json")
        conn.execute("CREATE TABLE cur (j json, x xml, dj dj, n int)")
        conn.execute("""INSERT INTO cur VALUES ('{"a": 1}', '<a/>', '[1]', 1)""")
    _pg(tmp_path, pg_database, f"      cur:\n        key: [{key}]" + CURSOR.format("n"))
    says = f"dataset 'cur': key column {key!r}"
    _refused(tmp_path, tools, "capture", says=says)
    check = tools.cli(tmp_path, "check")
    said = " ".join(check.stdout.split())
    assert check.returncode == 2 and "cannot order pages" in said, check.stdout


@pytest.mark.parametrize("column", ["name", "at_time", "flags"])
def test_a_mariadb_cursor_no_read_can_order_is_refused_before_a_run(
    tmp_path: Path, mariadb_database: str, tools, column: str
) -> None:
    """Reproduction: a cursor on a VARCHAR, TIME or BIT column; `combined check` said ok,
    and every capture failed (exit 1, "retry later") on "cannot serve as a cursor"."""
    kwargs = MariaSettings.from_config({"dsn": mariadb_database}).connect_kwargs()
    with pymysql.connect(**kwargs) as conn, conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE cur_{column} (id int PRIMARY KEY, name varchar(20), at_time time, "
            "flags bit(8), n int)"
        )
        cur.execute(f"INSERT INTO cur_{column} VALUES (1, 'a', '10:00:00', 1, 1)")
        conn.commit()
    head = "version: 1\nlake: ./lake\nsources:\n  pg:\n    connector: mariadb\n"
    body = f"    config:\n      dsn: {mariadb_database}\n    datasets:\n"
    (tmp_path / "combined.yaml").write_text(
        head + body + f"      cur_{column}:\n        key: [id]" + CURSOR.format(column) + "\n"
    )
    _refused(tmp_path, tools, "capture", says=f"dataset 'cur_{column}': column {column!r} (")
    check = tools.cli(tmp_path, "check")
    said = " ".join(check.stdout.split())
    assert check.returncode == 2 and "cannot serve as a cursor" in said, check.stdout


def test_a_misspelt_key_or_cursor_of_a_first_capture_is_refused_before_a_run(
    tmp_path: Path, tools
) -> None:
    """`combined check` refused it, but a capture made a Run that failed (exit 1, "retry
    later", an alert), and an orchestrator retried it for nothing (found by a new-user
    review). A relation missing is still the Run's to say."""
    from tests.conftest import make_shop

    project = make_shop(tmp_path)
    text = project.read_text()
    project.write_text(
        text.replace("      customers:\n        key: [id]", "      customers:\n        key: [idd]")
    )
    _refused(tmp_path, tools, "capture", says="key column 'idd' is not a column of 'customers'")
    _no_runs(tmp_path)
    project.write_text(text)
    assert tools.cli(tmp_path, "capture").returncode == 0


def test_a_refusal_names_its_source(tmp_path: Path, pg_database: str, tools) -> None:
    """Reproduction: a dsn naming a database the server lacks; `combined capture` of a
    project of several sources said "error: the postgres database does not exist"
    without saying which source's dsn to fix (`combined check` names it)."""
    _pg(tmp_path, pg_database + "_missing", "      t:\n        key: [id]")
    says = "error: source pg: the postgres database does not exist"
    _refused(tmp_path, tools, "capture", says=says)


def test_cdc_from_a_server_without_logical_wal_is_refused_before_a_run(
    tmp_path: Path, tools
) -> None:
    """Reproduction: a cdc dataset on a server at wal_level=replica; `combined capture`
    made a Run that ended failed (exit 1, "retry later"), and every retry or scheduled
    tick failed the same until a superuser restarted the server; `combined check`
    exited 1 as for a server it could not reach."""
    with private_cluster("-c wal_level=replica") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        _pg(tmp_path, dsn, "      t:\n        key: [id]\n        strategy: cdc")
        says = "dataset 't': change capture (strategy: cdc) needs wal_level=logical"
        _refused(tmp_path, tools, "capture", says=says)
        check = tools.cli(tmp_path, "check")
        assert check.returncode == 2, (check.stdout, check.stderr)
        assert "wal_level=logical, the server has replica" in " ".join(check.stdout.split())


def test_cdc_status_on_a_server_without_logical_wal_says_why_no_slot_can_exist(
    tmp_path: Path, tools
) -> None:
    """Reproduction: `combined cdc status` on a server at wal_level=replica exited 0 and
    showed the slot missing, saying nothing of wal_level: the slot can never be made
    there until a superuser changes it and restarts the server."""
    with private_cluster("-c wal_level=replica") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
            conn.execute("CREATE TABLE u (id int PRIMARY KEY)")
        cdc = "        key: [id]\n        strategy: cdc"
        _pg(tmp_path, dsn, f"      t:\n{cdc}\n      u:\n{cdc}")
        status = tools.cli(tmp_path, "cdc", "status", "pg")
        said = " ".join(status.stderr.split())
        assert status.returncode == 2, (status.stdout, status.stderr)
        assert "pg.t" in status.stdout and "pg.u" in status.stdout  # (the table still shown)
        assert (
            "pg.t, pg.u: change capture (strategy: cdc) needs wal_level=logical, "
            "the server has replica" in said
        ), said
        assert said.count("ALTER SYSTEM SET wal_level = logical") == 1, said  # (told once)
        _no_runs(tmp_path)
