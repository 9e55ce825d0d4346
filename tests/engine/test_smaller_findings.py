"""Smaller findings of the review, each kept fixed (issue 23, item 25)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import psycopg

from combined.catalog import data as cat
from combined.catalog import runs as runs_repo
from combined.engine import Engine


def _shop(tmp_path: Path, tools, **kw: int) -> Engine:
    tools.make(tmp_path, **kw)
    return Engine.open(tmp_path / "combined.yaml")


def test_the_staging_byte_limit_stops_a_run_while_a_part_is_written(tmp_path: Path, tools) -> None:
    """Reproduction: a 3 MiB staging limit and a table staging ~13 MB in one part:
    the Run failed only when the part closed, "the run staged 13... bytes"."""
    tools.make(tmp_path, orders=100_000)
    tools.sql(
        tmp_path,
        "ALTER TABLE orders ADD COLUMN note TEXT; UPDATE orders SET note = hex(randomblob(50));",
    )
    project = tmp_path / "combined.yaml"
    text = project.read_text().replace("sources:", "staging:\n  max_bytes: 3MiB\nsources:")
    text = text.replace(
        "      orders:\n        key: [id]\n",
        "      orders:\n        key: [id]\n        batch_rows: 5000\n",
    )
    project.write_text(text)
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "failed", run.error
        staged = int(re.search(r"the run staged (\d+) bytes", run.error or "").group(1))  # type: ignore[union-attr]
        assert 3 * 2**20 < staged < 4 * 2**20, staged  # one batch past the limit at most
    finally:
        engine.close()


def test_a_successful_runs_attempt_ends_succeeded(tmp_path: Path, tools) -> None:
    """Reproduction: `combined run show` of a succeeded Run listed its Attempt as `staged`."""
    engine = _shop(tmp_path, tools)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with engine.catalog.begin() as conn:
            (attempt,) = runs_repo.list_attempts(conn, run.id)
        assert attempt.outcome == "succeeded" and attempt.ended_at is not None
    finally:
        engine.close()


def test_a_run_after_a_catalog_loss_is_no_first_sync(tmp_path: Path, tools) -> None:
    """Reproduction: capture, delete .combined/ (the catalog), capture again: the Run was
    labelled `first_sync` although the lake held the datasets."""
    engine = _shop(tmp_path, tools)
    try:
        (run,) = engine.capture()
        assert run.trigger == "first_sync"
    finally:
        engine.close()
    shutil.rmtree(tmp_path / ".combined")
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.trigger == "manual", run.trigger
    finally:
        engine.close()


def test_more_than_a_thousand_duplicate_keys_are_said_to_be_more(tmp_path: Path, tools) -> None:
    """Reproduction: 1001 keys held twice each; the error said "holds 1000 duplicate key(s)"."""
    engine = _shop(tmp_path, tools, orders=2002)
    tools.sql(tmp_path, "UPDATE orders SET customer_id = id % 1001;")
    project = tmp_path / "combined.yaml"
    project.write_text(
        project.read_text().replace(
            "      orders:\n        key: [id]", "      orders:\n        key: [customer_id]"
        )
    )
    engine.close()
    engine = Engine.open(project)
    try:
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "needs_review", run.error
        assert "holds more than 1000 duplicate key(s)" in (run.error or "")
    finally:
        engine.close()


def test_sql_csv_ends_lines_with_a_line_feed(tmp_path: Path, tools) -> None:
    """Reproduction: `combined sql --format csv` ended every line with CRLF."""
    tools.make(tmp_path)
    assert tools.cli(tmp_path, "capture").returncode == 0
    result = subprocess_bytes(
        tmp_path, "sql", "--format", "csv", "SELECT id FROM shop.orders ORDER BY id LIMIT 2"
    )
    assert result == b"id\n1\n2\n"


def subprocess_bytes(root: Path, *args: str) -> bytes:
    """The CLI's standard output, as bytes."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "from combined.cli import main; main()", *args],
        cwd=root,
        capture_output=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def test_an_as_of_before_a_dataset_existed_says_it_had_no_publication(
    tmp_path: Path, tools
) -> None:
    """Reproduction: capture shop.customers, later shop.orders; `combined sql --as-of`
    an instant between them, over shop.orders, failed with DuckDB's "Table with name
    orders does not exist! Did you mean information_schema.schemata"."""
    engine = _shop(tmp_path, tools)
    try:
        engine.capture(["shop.customers"])
        (first,) = engine.publications(1)
        engine.capture(["shop.orders"])
        result = tools.cli(
            tmp_path,
            "sql",
            "--as-of",
            first["published_at"].isoformat(),
            "SELECT count(*) FROM shop.orders",
        )
        assert result.returncode != 0
        said = " ".join(result.stderr.split())
        assert "shop.orders is not in the published basis read" in said
        assert f"({first['id']}, published" in said and "had no publication at that time" in said
        assert "information_schema" not in said
        # a misspelt name is told with the closest dataset of the basis
        typo = tools.cli(tmp_path, "sql", "SELECT count(*) FROM shop.ordrs")
        told = " ".join(typo.stderr.split())
        assert typo.returncode == 2, typo.stderr
        assert "hint: did you mean shop.orders? or query a later instant" in told, told
    finally:
        engine.close()


def test_discover_keeps_its_version_when_nothing_changed_and_shows_strategies(
    tmp_path: Path, pg_database: str, tools
) -> None:
    """Reproduction: `combined discover pg` twice stored versions 1 and 2 of the same
    findings; a PostgreSQL table with a primary key was not offered `cdc`; the CLI
    printed no strategies or sync modes."""
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    (tmp_path / "combined.yaml").write_text(
        "version: 1\nlake: ./lake\nsources:\n  pg:\n    connector: postgres\n"
        f"    config:\n      dsn: {pg_database}\n    datasets:\n      t:\n        key: [id]\n"
    )
    first = tools.cli(tmp_path, "discover", "pg")
    assert first.returncode == 0, first.stderr
    said = " ".join(first.stdout.split())
    assert (
        "strategies: snapshot, cursor, cdc; sync modes: incremental, append, full_refresh" in said
    )
    assert _discovered(tmp_path, tools) == 1  # the same findings: no second version
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("ALTER TABLE t ADD COLUMN w text")
    assert _discovered(tmp_path, tools) == 2


def _discovered(root: Path, tools) -> int:
    """Discover source pg again; the version of its newest stored discovery."""
    assert tools.cli(root, "discover", "pg").returncode == 0
    engine = Engine.open(root / "combined.yaml")
    try:
        with engine.catalog.begin() as conn:
            row = cat.latest_discovery(conn, "pg")
        assert row is not None
        return int(row.version)
    finally:
        engine.close()
