"""`combined cdc setup/status/teardown/follow` against a real PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from combined import cdc
from combined.catalog import Run
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._pgoutput import text_to_lsn
from combined.connectors.postgres._replication import slot_status
from combined.engine import Engine
from combined.errors import SourceUnavailable
from combined.lake import LakeTable

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
        relation: public.items
        key: [id]
        strategy: cdc
"""


@pytest.fixture
def project(tmp_path: Path, cdc_db) -> tuple[Path, str, str]:
    pg_database = cdc_db.dsn
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text)")
        conn.execute("INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 2000) g")
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=pg_database, prefix=cdc_db.prefix))
    return tmp_path, pg_database, cdc_db.slot("public.items")


def _source(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute("SELECT id, qty, note FROM items ORDER BY id"))


def _lake(root: Path) -> list[tuple[object, ...]]:
    engine = Engine.open(root / "combined.yaml")
    try:
        rows = engine.sql("SELECT id, qty, note FROM pg.items ORDER BY id").to_pylist()
    finally:
        engine.close()
    return [tuple(r.values()) for r in rows]


def test_setup_status_teardown_and_resnapshot(project: tuple[Path, str, str], tools) -> None:
    root, dsn, slot = project
    setup = tools.cli(root, "cdc", "setup", "pg")
    assert setup.returncode == 0, setup.stderr
    assert f"publication {slot} created" in setup.stdout and "succeeded" in setup.stdout
    assert slot_status(Settings(dsn), slot).exists
    assert _lake(root) == _source(dsn)

    # a pipe gets the table at its full width, whatever the terminal's: no id cut
    status = tools.cli(root, "cdc", "status", "pg", env={"COLUMNS": "80"})
    assert status.returncode == 0, status.stderr
    assert "pg.items" in status.stdout and slot in status.stdout
    assert "…" not in status.stdout, status.stdout

    refused = tools.cli(root, "cdc", "teardown", "pg")  # no tty, no --yes: nothing dropped
    assert refused.returncode == 1 and "nothing dropped" in refused.stderr
    assert slot_status(Settings(dsn), slot).exists

    dropped = tools.cli(root, "cdc", "teardown", "pg", "--yes")
    assert dropped.returncode == 0, dropped.stderr
    assert "dropped" in dropped.stdout and "checkpoint voided" in dropped.stdout
    assert not slot_status(Settings(dsn), slot).exists

    # changes while no slot existed are reconciled by the new snapshot, deletes included
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM items WHERE id > 1990")
        conn.execute("UPDATE items SET note = 'while down' WHERE id <= 5")
    again = tools.cli(root, "capture")
    assert again.returncode == 0, again.stderr
    assert slot_status(Settings(dsn), slot).exists
    assert _lake(root) == _source(dsn)


def test_status_tells_the_slot_a_dataset_removed_from_the_project_left(
    project: tuple[Path, str, str], tools, cdc_db
) -> None:
    """Removed from combined.yaml, a cdc dataset's slot stayed on the server holding its
    WAL back for ever, and no command said so (found by a PostgreSQL CDC review)."""
    root, dsn, slot = project
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE gone (id bigint PRIMARY KEY)")
    path = root / "combined.yaml"
    declared = path.read_text()
    path.write_text(
        declared + "      gone:\n        relation: public.gone\n"
        "        key: [id]\n        strategy: cdc\n"
    )
    assert tools.cli(root, "cdc", "setup", "pg").returncode == 0
    left = cdc_db.slot("public.gone")
    assert slot_status(Settings(dsn), left).exists
    status = tools.cli(root, "cdc", "status", "pg")
    assert status.returncode == 0 and left not in status.stderr, status.stderr
    path.write_text(declared)  # the dataset removed from the project
    status = tools.cli(root, "cdc", "status", "pg")
    assert status.returncode == 0, status.stderr
    told = " ".join(status.stderr.split())
    assert f"slot {left} is named with this source's slot_prefix but no declared" in told
    assert f"SELECT pg_drop_replication_slot('{left}')" in told
    assert slot not in told and slot in status.stdout  # the declared one is in the table
    assert slot_status(Settings(dsn), left).exists  # told, never dropped


@pytest.mark.parametrize("recycle_mb", ["0", "1"])
def test_follow_publishes_each_iteration(
    project: tuple[Path, str, str], tools, recycle_mb: str
) -> None:
    """With ``--recycle-mb 1`` every capture grows the process by more: it starts
    afresh in place after each but the last, its ``--iterations`` counting on."""
    root, dsn, _ = project
    assert tools.cli(root, "cdc", "setup", "pg").returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, 0, 'f' FROM generate_series(3001, 3500) g")
    follow = tools.cli(
        root,
        "cdc",
        "follow",
        "pg",
        "--every",
        "0.2",
        "--max-changes",
        "200",
        "--iterations",
        "4",
        "--recycle-mb",
        recycle_mb,
    )
    assert follow.returncode == 0, follow.stderr
    lines = [ln for ln in follow.stdout.splitlines() if " run " in ln]
    assert len(lines) == 4 and all("succeeded" in ln for ln in lines)
    assert sum(int(ln.split(": ")[-1].split()[0]) for ln in lines) == 500  # (changes)
    restarts = 3 if recycle_mb == "1" else 0
    assert follow.stderr.count("starting afresh in place") == restarts, follow.stderr
    assert _lake(root) == _source(dsn)


def test_setup_of_a_relation_whose_names_need_quotes_captures_and_streams(
    tmp_path: Path, cdc_db, tools
) -> None:
    """A table `it.ems "q"` in schema `Sch.em "a"`: setup created the publication,
    then its first capture added the table again ("relation ... is already member
    of publication"), and so did every capture after it: the publication's tables
    were compared as unquoted text with the configuration's quoted names."""
    schema, table = 'Sch.em "a"', 'it.ems "q" ' + "x" * 52  # 63 characters
    assert len(table) == 63
    name = sql.Identifier(schema, table)
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, qty int, note text)").format(name)
        )
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT g, g, 'n' FROM generate_series(1, 50) g").format(name)
        )
    quoted = '"' + schema.replace('"', '""') + '"."' + table.replace('"', '""') + '"'
    relation = quoted.replace("\\", "\\\\").replace('"', '\\"')
    project = PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix)
    (tmp_path / "combined.yaml").write_text(project.replace("public.items", f'"{relation}"'))
    cdc_db.slot(quoted)
    setup = tools.cli(tmp_path, "cdc", "setup", "pg")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {} SET qty = -qty WHERE id % 3 = 0").format(name))
        conn.execute(sql.SQL("DELETE FROM {} WHERE id > 45").format(name))
    again = tools.cli(tmp_path, "capture")
    assert again.returncode == 0, again.stdout + again.stderr
    with psycopg.connect(cdc_db.dsn) as conn:
        source = list(
            conn.execute(sql.SQL("SELECT id, qty, note FROM {} ORDER BY id").format(name))
        )
    assert len(source) == 45 and _lake(tmp_path) == source


@pytest.mark.slow
@pytest.mark.parametrize(
    "boundary", ["after_staging", "during_commit", "after_commit", "after_projection"]
)
def test_kill_at_each_boundary_lands_each_change_once(
    project: tuple[Path, str, str], tools, boundary: str
) -> None:
    root, dsn, slot = project
    assert tools.cli(root, "cdc", "setup", "pg").returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET qty = qty + 1 WHERE id <= 300")
        conn.execute("DELETE FROM items WHERE id BETWEEN 1001 AND 1100")
        conn.execute("INSERT INTO items SELECT g, 1, 'k' FROM generate_series(5001, 5200) g")
    killed = tools.cli(root, "capture", env={"COMBINED_FAULT": boundary})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    table = LakeTable(root / "lake" / "pg" / "items", "combined:pg/items")
    meta = table.latest_commit()
    assert meta is not None
    # the slot is never confirmed past the lake's committed position
    confirmed = slot_status(Settings(dsn), slot).confirmed_flush_lsn
    assert confirmed is not None and confirmed <= text_to_lsn(meta["checkpoint"]["lsn"])
    again = tools.cli(root, "capture")
    assert again.returncode == 0, again.stderr
    assert _lake(root) == _source(dsn)
    engine = Engine.open(root / "combined.yaml")
    try:
        (usage,) = engine.usage()
        # 2000 snapshot + 200 inserted; updates and deletes hit rows already counted
        assert usage["mar"] == 2200
        dup = (
            engine.sql("SELECT count(*) - count(DISTINCT _combined_id) AS d FROM pg.items")
            .column("d")[0]
            .as_py()
        )
        assert dup == 0
    finally:
        engine.close()


def test_cdc_connections_honour_connect_timeout(tmp_path: Path, silent_server) -> None:
    # The server accepts the connection and never answers: only connect_timeout
    # ends the wait, for the replication and control connections as for the rest.
    project = PROJECT.format(dsn=silent_server.dsn, prefix="ct_silent").replace(
        "      slot_prefix:", "      connect_timeout: 2\n      slot_prefix:"
    )
    (tmp_path / "combined.yaml").write_text(project)

    def status() -> object:
        engine = Engine.open(tmp_path / "combined.yaml")
        try:
            return cdc.status(engine, "pg")
        finally:
            engine.close()

    def capture() -> Run:
        engine = Engine.open(tmp_path / "combined.yaml")
        try:
            (run,) = engine.capture()
            return run
        finally:
            engine.close()

    started = time.monotonic()
    err = silent_server.outcome(status, seconds=30)
    assert isinstance(err, SourceUnavailable), err
    assert "timeout" in err.message and time.monotonic() - started < 15
    run = silent_server.outcome(capture, seconds=60)
    assert isinstance(run, Run) and run.state == "failed", run
    assert "timeout" in (run.error or "")


def test_status_of_a_missing_database_says_to_fix_the_dsn(
    tmp_path: Path, pg_server_dsn: str, tools
) -> None:
    missing = f"ct_missing_{uuid.uuid4().hex[:8]}"
    dsn = make_conninfo(pg_server_dsn, dbname=missing)
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=dsn, prefix="ct_missing"))
    shown = tools.cli(tmp_path, "cdc", "status", "pg", env={"COLUMNS": "250"})
    assert shown.returncode == 2
    assert f'database "{missing}" does not exist' in shown.stderr
    assert "fix the database name in the dsn" in shown.stderr
    assert "retried" not in shown.stderr


@pytest.fixture
def owner_without_replication(project: tuple[Path, str, str]) -> Iterator[str]:
    """A role that owns the captured table and may publish it, but lacks REPLICATION."""
    _, dsn, _ = project
    role = f"ct_owner_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOREPLICATION").format(sql.Identifier(role)))
        try:
            conn.execute(
                sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                    sql.Identifier(conn.info.dbname), sql.Identifier(role)
                )
            )
            conn.execute(sql.SQL("ALTER TABLE items OWNER TO {}").format(sql.Identifier(role)))
            yield role
        finally:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_role_without_replication_is_told_the_cause_and_the_grant(
    project: tuple[Path, str, str], owner_without_replication: str, cdc_db, tools
) -> None:
    root, dsn, _ = project
    role = owner_without_replication
    (root / "combined.yaml").write_text(
        PROJECT.format(dsn=make_conninfo(dsn, user=role), prefix=cdc_db.prefix)
    )
    engine = Engine.open(root / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "needs_auth", run.error
        error = run.error or ""
        # the server's own words, as the Run (and the CLI, which prints it) keeps them
        assert "must be superuser or replication role" in error or "WAL sender" in error
        assert f'ALTER ROLE "{role}" REPLICATION' in error
        assert len(engine.run(run.id)["attempts"]) == 1
    finally:
        engine.close()


def test_two_cdc_datasets_of_one_table_are_refused_before_any_slot(
    project: tuple[Path, str, str], tools
) -> None:
    """They would share one slot: each capture confirmed it past the other's changes."""
    root, dsn, slot = project
    yaml = root / "combined.yaml"
    yaml.write_text(
        yaml.read_text()
        + "      item_events:\n        relation: items\n        key: [id]\n"
        + "        strategy: cdc\n        sync_mode: append\n"
    )
    for argv in (["check"], ["cdc", "setup", "pg"], ["capture"]):
        refused = tools.cli(root, *argv)
        text = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode == 2, (argv, text)
        assert "datasets items and item_events both stream relation 'items' by cdc" in text
        assert f"share the postgres stream {slot}" in text and "history: true" in text
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", [slot]
        ).fetchone()
    assert found == (0,)


def test_a_publication_narrowed_by_a_row_filter_is_refused_until_a_new_snapshot(
    project: tuple[Path, str, str], tools
) -> None:
    """Setup said "verified", then each row updated out of the filter came as a
    delete and left the lake while the source still held it. Refused, the filter
    removed, the next capture passed: the changes made under it were lost for good."""
    root, dsn, slot = project
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.info.server_version < 150000:
            pytest.skip("row filters came with PostgreSQL 15")
        conn.execute(f"CREATE PUBLICATION {slot} FOR TABLE items WHERE (qty > 10)")
    refused = tools.cli(root, "cdc", "setup", "pg")
    text = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0 and "public.items with a row filter" in text, text
    assert f"ALTER PUBLICATION {slot} SET TABLE public.items" in text
    assert not slot_status(Settings(dsn), slot).exists

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER PUBLICATION {slot} SET TABLE items")
    setup = tools.cli(root, "cdc", "setup", "pg")
    assert setup.returncode == 0 and "succeeded" in setup.stdout, setup.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")  # (a filter on qty needs it)
        conn.execute(f"ALTER PUBLICATION {slot} SET TABLE items WHERE (qty > 10)")
        conn.execute("UPDATE items SET qty = 5 WHERE id = 20")  # streamed as a delete
        conn.execute("UPDATE items SET note = 'unseen' WHERE id = 3")  # not streamed
    engine = Engine.open(root / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "needs_review", run.error
        assert "with a row filter" in (run.error or "") and "new snapshot" in (run.error or "")
    finally:
        engine.close()
    assert (20, 20, "n20") in _lake(root)  # (the stream's delete was not applied)
    confirmed = slot_status(Settings(dsn), slot).confirmed_flush_lsn

    # The filter removed, the changes made under it are still not streamed: refused.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER PUBLICATION {slot} SET TABLE items")
    again = tools.cli(root, "capture")
    text = " ".join((again.stdout + again.stderr).split())
    assert again.returncode == 3, text  # needs_review
    assert "with a row filter" in text and f"ALTER PUBLICATION {slot} SET TABLE" in text, text
    assert "cdc teardown" in text, text
    assert slot_status(Settings(dsn), slot).confirmed_flush_lsn == confirmed
    assert (20, 20, "n20") in _lake(root) and (3, 3, "n3") in _lake(root)
    status = tools.cli(root, "cdc", "status", "pg")
    told = " ".join(status.stderr.split())
    assert status.returncode == 0, told
    assert "pg.items: every capture is refused until a new snapshot" in told, told
    assert "with a row filter" in told and "cdc teardown" in told, told
    checked = tools.cli(root, "check")  # (it said ok, and every capture was refused)
    told = " ".join((checked.stdout + checked.stderr).split())
    assert checked.returncode != 0 and "refused until a new snapshot" in told, told

    # A new snapshot clears it, and takes what the filter kept out.
    assert tools.cli(root, "cdc", "teardown", "pg", "--yes").returncode == 0
    setup = tools.cli(root, "cdc", "setup", "pg")
    assert setup.returncode == 0 and "succeeded" in setup.stdout, setup.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET qty = 7 WHERE id = 21")
    _captured_whole(root, dsn, tools)


def test_a_first_capture_of_a_narrowed_publication_needs_review(
    project: tuple[Path, str, str], tools
) -> None:
    """A publication narrowed after setup verified it (or without setup) ended the first
    capture `failed`, which schedules and `cdc follow` retried for ever."""
    root, dsn, slot = project
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.info.server_version < 150000:
            pytest.skip("column lists came with PostgreSQL 15")
        conn.execute(f"CREATE PUBLICATION {slot} FOR TABLE items (id, qty)")
    first = tools.cli(root, "capture")
    text = " ".join((first.stdout + first.stderr).split())
    assert first.returncode == 3, text  # needs_review
    assert "public.items with a column list" in text, text
    assert f"ALTER PUBLICATION {slot} SET TABLE public.items" in text, text
    assert not slot_status(Settings(dsn), slot).exists

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER PUBLICATION {slot} SET TABLE items")
    _captured_whole(root, dsn, tools)


def _captured_whole(root: Path, dsn: str, tools) -> None:
    """`combined capture` succeeds, and the lake then holds the source's rows."""
    done = tools.cli(root, "capture")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _lake(root) == _source(dsn)


def test_two_sources_on_one_server_computing_one_slot_are_refused(
    project: tuple[Path, str, str], tools
) -> None:
    """Slot names are the server's: two sources capturing public.items under one
    slot_prefix share one slot, and `combined check` passed."""
    root, dsn, slot = project
    yaml = root / "combined.yaml"
    text = yaml.read_text()
    second = text.split("sources:\n", 1)[1].replace("  pg:", "  pg_b:", 1)
    yaml.write_text(text + second)  # the same database, as a second source
    for argv in (["check"], ["cdc", "setup", "pg"], ["cdc", "setup", "pg_b"], ["capture"]):
        refused = tools.cli(root, *argv)
        out = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode == 2, (argv, out)
        assert "sources pg (dataset items, relation 'public.items') and pg_b" in out, out
        assert f"under one stream name, {slot}" in out and "distinct `slot_prefix`" in out
    assert not slot_status(Settings(dsn), slot).exists
    # Another server (as the dsns name them) is not refused.
    yaml.write_text(text + second.replace(dsn, make_conninfo(dsn, host="192.0.2.1")))
    setup = tools.cli(root, "cdc", "setup", "pg")
    assert setup.returncode == 0, setup.stdout + setup.stderr


def test_setup_never_drops_the_slot_another_database_made(
    project: tuple[Path, str, str], tools, pg_server_dsn: str
) -> None:
    """Two projects whose databases both hold public.items under one slot_prefix:
    the second's setup dropped the first's slot as its own leftover."""
    from tests.pg_cleanup import drop_database

    root, dsn, slot = project
    first = tools.cli(root, "cdc", "setup", "pg")
    assert first.returncode == 0, first.stderr
    name = f"combined_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        other = make_conninfo(dsn, dbname=name)
        with psycopg.connect(other, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, qty int, note text)")
        (root / "b").mkdir()
        (root / "b" / "combined.yaml").write_text(
            (root / "combined.yaml").read_text().replace(dsn, other)
        )
        refused = tools.cli(root / "b", "cdc", "setup", "pg")
        text = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode == 2, text
        made_in = slot_status(Settings(dsn), slot).database
        assert f"replication slot '{slot}' belongs to database '{made_in}'" in text, text
        assert "distinct `slot_prefix`" in text
        with psycopg.connect(other) as conn:  # setup left nothing behind
            assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)
        refused = tools.cli(root / "b", "cdc", "teardown", "pg", "--yes")
        assert refused.returncode == 2 and "belongs to database" in refused.stderr
        # A capture is refused before its Run, as setup (it was a Run that failed, exit
        # 1, "retry later"; no retry helps)
        refused = tools.cli(root / "b", "capture")
        text = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode == 2 and f"belongs to database '{made_in}'" in text, text
        assert "distinct `slot_prefix`" in text and "run r" not in text, text
        status = slot_status(Settings(dsn), slot)
        assert status.exists and status.database == made_in
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET note = 'after' WHERE id = 1")
        again = tools.cli(root, "capture")
        assert again.returncode == 0, again.stderr
        assert _lake(root) == _source(dsn)
    finally:
        drop_database(pg_server_dsn, name)


@pytest.mark.parametrize("recycle_mb", ["0", "1"])
def test_follow_goes_on_after_a_failed_run_and_says_so_when_it_ends(
    project: tuple[Path, str, str], tools, recycle_mb: str
) -> None:
    """A follower ended for good on its first Run that did not succeed (here: another
    capture held the dataset's lease), a loop meant to run for weeks."""
    from datetime import timedelta

    from combined.catalog import _schema as t

    root, dsn, _ = project
    assert tools.cli(root, "cdc", "setup", "pg").returncode == 0
    engine = Engine.open(root / "combined.yaml")
    try:  # a capture on another machine holds the dataset until the follower failed once
        assert engine.catalog.acquire_lease("pg", "items", "r-elsewhere", timedelta(minutes=5))
        with engine.catalog.begin() as conn:
            conn.execute(t.leases.update().values(holder="elsewhere:1:"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE items SET note = 'followed' WHERE id <= 3")
        argv = ["cdc", "follow", "pg", "--every", "1", "--iterations", "2"]
        follower = subprocess.Popen(
            [sys.executable, "-c", "from combined.cli import main; main()", *argv]
            + ["--recycle-mb", recycle_mb],
            cwd=root,
            env={**os.environ, "COMBINED_RETRY_BACKOFF_S": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert follower.stdout is not None
        first = follower.stdout.readline()  # (a fixed lease outlived a slow start once)
        assert " failed: " in first, first
        with engine.catalog.begin() as conn:
            conn.execute(t.leases.delete().where(t.leases.c.dataset == "items"))
        rest, err = follower.communicate(timeout=120)
    finally:
        engine.close()
    lines = [ln for ln in (first + rest).splitlines() if " run " in ln]
    assert [ln.split()[4].rstrip(":") for ln in lines] == ["failed", "succeeded"], rest
    # (a Run of the loop failed: said at its end, after a start afresh in place too)
    assert follower.returncode == 1, err
    assert err.count("starting afresh in place") == int(recycle_mb), err
    # (an outage was a failed Run every few seconds: the next waits twice as long)
    assert "1 capture in a row failed: the next starts 2 s after the last began" in err
    assert _lake(root) == _source(dsn)


def test_follow_waits_longer_after_each_failed_capture_in_a_row() -> None:
    from combined.cdc import MAX_FOLLOW_PAUSE_S, follow_pause

    assert [follow_pause(5.0, n) for n in range(4)] == [5.0, 10.0, 20.0, 40.0]
    assert follow_pause(5.0, 7) == MAX_FOLLOW_PAUSE_S == follow_pause(5.0, 10_000)
    assert follow_pause(900.0, 3) == 900.0  # (never sooner than asked)
    assert [follow_pause(0.0, n) for n in range(3)] == [0.0, 2.0, 4.0]  # (--every 0)
