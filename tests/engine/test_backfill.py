"""Partitioned backfills and dropped connections, through the engine, on real PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from combined.catalog import data as cat
from combined.engine import Engine
from combined.errors import ConfigError

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
        batch_rows: 2000
"""


def _make(tmp_path: Path, dsn: str, rows: int) -> Path:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, total numeric(12,2), note text)")
        conn.execute(
            f"INSERT INTO orders SELECT g, g * 0.25, 'n' || g FROM generate_series(1, {rows}) g"
        )
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=dsn))
    return tmp_path / "combined.yaml"


def _lake(engine: Engine) -> list[tuple[object, ...]]:
    rows = engine.sql("SELECT id, total, note FROM pg.orders ORDER BY id").to_pylist()
    return [tuple(r.values()) for r in rows]


def _source(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute("SELECT id, total, note FROM orders ORDER BY id"))


def test_partitioned_backfill_lands_the_table_and_checks_control_totals(
    tmp_path: Path, pg_database: str, tools
) -> None:
    _make(tmp_path, pg_database, 20_000)
    result = tools.cli(
        tmp_path,
        "backfill",
        "pg.orders",
        "--partitions",
        "4",
        "--sum-column",
        "total",
        "--from",
        "1",
        "--to",
        "20001",
    )
    assert result.returncode == 0, result.stderr
    assert "20000 read in 4 partitions" in result.stdout and "control reconciled" in result.stdout
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert _lake(engine) == _source(pg_database)
        with engine.catalog.begin() as conn:
            (event,) = cat.activity(conn, kind="reconciliation.control")
        assert event.body["control"]["rows"] == 20_000
        assert Decimal(event.body["control"]["sum"]) == Decimal("50002500.00")
        assert event.body["landed"]["rows"] == 20_000
        receipt = engine.publications(1)[0]["member_rows"][0]["extraction_receipt"]
        assert receipt["snapshot_authority"] == "postgresql:pg_export_snapshot"
        assert receipt["rows"] == 20_000 and receipt["extraction_completed_at"] is not None
    finally:
        engine.close()


def test_a_range_backfill_changes_only_its_range(tmp_path: Path, pg_database: str) -> None:
    project = _make(tmp_path, pg_database, 1000)
    engine = Engine.open(project)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("DELETE FROM orders WHERE id BETWEEN 100 AND 149")
            conn.execute("UPDATE orders SET note = 'inside' WHERE id = 150")
            conn.execute("UPDATE orders SET note = 'outside' WHERE id = 900")
        run = engine.backfill("pg.orders", partitions=2, lower="100", upper="200")
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        stats = run.stats["orders"]
        assert (stats["inserts"], stats["updates"], stats["deletes"]) == (0, 1, 50)
        rows = {r[0]: r for r in _lake(engine)}
        assert 120 not in rows and rows[150][2] == "inside"
        assert rows[900][2] == "n900"  # outside the range: untouched until the next capture
        assert len(rows) == 950
    finally:
        engine.close()


def test_a_dropped_connection_fails_the_attempt_and_the_retry_lands_once(
    tmp_path: Path, pg_database: str, monkeypatch
) -> None:
    monkeypatch.setenv("COMBINED_RETRY_BACKOFF_S", "0")
    project = _make(tmp_path, pg_database, 300_000)
    killed: list[int] = []

    def assassin() -> None:
        deadline = time.monotonic() + 60
        with psycopg.connect(pg_database, autocommit=True) as conn:
            while not killed and time.monotonic() < deadline:
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND query ILIKE '%FROM%orders%' "
                    "AND state = 'active'"
                ).fetchall()
                for (pid,) in rows:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    killed.append(pid)
                time.sleep(0.005)

    thread = threading.Thread(target=assassin)
    thread.start()
    engine = Engine.open(project)
    try:
        (run,) = engine.capture()
        thread.join()
        assert killed, "the read finished before it could be interrupted"
        assert run.state == "succeeded", run.error
        attempts = engine.run(run.id)["attempts"]
        assert len(attempts) == 2 and attempts[0].outcome == "failed"
        assert engine.sql(
            "SELECT count(*) AS n, count(DISTINCT id) AS d FROM pg.orders"
        ).to_pylist() == [{"n": 300_000, "d": 300_000}]
        deliveries = engine.run(run.id)["deliveries"]
        assert sum(d.record_count for d in deliveries) == 300_000
        assert {d.state for d in deliveries} == {"committed"}
    finally:
        thread.join()
        engine.close()


CURSOR_PROJECT = """\
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
        strategy: cursor
        control_sum: total
        cursor:
          column: id
          trust: "ids come from a sequence and rows are never updated in place"
"""


def test_a_bulk_update_the_cursor_cannot_see_is_reported_by_reconciliation(
    tmp_path: Path, pg_database: str
) -> None:
    _make(tmp_path, pg_database, 1000)
    (tmp_path / "combined.yaml").write_text(CURSOR_PROJECT.format(dsn=pg_database))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.stats is not None and run.stats["orders"]["reconciliation"] == "reconciled"
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE orders SET total = total + 1 WHERE id <= 100")  # cursor stays
            conn.execute("INSERT INTO orders VALUES (1001, 1.00, 'new')")
        (run,) = engine.capture()
        # the new row lands; the bulk update is invisible to the cursor and is reported
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["orders"]["reconciliation"] == "mismatch"
        assert engine.sql("SELECT count(*) AS n FROM pg.orders").column("n")[0].as_py() == 1001
        with engine.catalog.begin() as conn:
            (alert,) = cat.activity(conn, kind="alert.reconciliation_failed")
            control = cat.activity(conn, kind="reconciliation.control", limit=1)[0]
        assert alert.body["source_status"] == "mismatch"
        assert control.body["control"]["sum_column"] == "total" and not control.body["ok"]
        assert (
            Decimal(control.body["control"]["sum"]) - Decimal(control.body["landed"]["sum"]) == 100
        )
        # a backfill recaptures what the cursor missed, and reconciles
        run = engine.backfill(
            "pg.orders", partitions=2, lower="1", upper="1002", sum_column="total"
        )
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["orders"]["updates"] == 100
    finally:
        engine.close()


def _ranked(tmp_path: Path, dsn: str) -> Engine:
    """1000 orders with a changeable ``rank`` (id % 100), captured once."""
    project = _make(tmp_path, dsn, 1000)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders ADD COLUMN rank int")
        conn.execute("UPDATE orders SET rank = id % 100")
    engine = Engine.open(project)
    engine.capture()
    return engine


def test_a_backfill_over_a_changeable_column_upserts_and_never_duplicates(
    tmp_path: Path, pg_database: str
) -> None:
    engine = _ranked(tmp_path, pg_database)
    try:
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE orders SET rank = 15, note = 'moved in' WHERE id = 5")  # 5 -> 15
        run = engine.backfill("pg.orders", partitions=2, column="rank", lower="10", upper="20")
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["orders"]["reconciliation"] == "reconciled"
        counts = engine.sql(
            "SELECT count(*) AS n, count(DISTINCT id) AS ids FROM pg.orders"
        ).to_pylist()
        assert counts == [{"n": 1000, "ids": 1000}]  # no id twice, none lost
        moved = engine.sql("SELECT note FROM pg.orders WHERE id = 5").to_pylist()
        assert moved == [{"note": "moved in"}]
    finally:
        engine.close()


def test_a_backfill_whose_range_the_lake_holds_more_of_is_not_published(
    tmp_path: Path, pg_database: str
) -> None:
    """A row that left the range is still in the lake's range: the backfill is held back.

    Reproduction: capture orders (rank = id % 100), move id 10 from rank 10 to
    95, backfill --column rank --from 10 --to 20. The source's range holds 99
    rows, the lake's 100 (id 10 at its old rank: a range over a changeable
    column cannot tell a row that moved out from a deleted one). It was
    published with reconciliation "mismatch"; now nothing is published
    (needs_review) until a whole capture carries the change.
    """
    engine = _ranked(tmp_path, pg_database)
    try:
        published = len(engine.publications(100))
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("UPDATE orders SET rank = 95 WHERE id = 10")  # 10 -> 95: moved out
        run = engine.backfill("pg.orders", partitions=2, column="rank", lower="10", upper="20")
        assert run.state == "needs_review", run.error
        assert "(99 rows, sum None) differ from what landed (100 rows" in (run.error or "")
        assert "combined capture pg.orders` carries rows gone from range" in (run.error or "")
        assert len(engine.publications(100)) == published
        (run,) = engine.capture()  # the whole capture carries the move and publishes
        assert run.state == "succeeded", run.error
        ranks = engine.sql("SELECT count(*) AS n FROM pg.orders WHERE rank = 95").to_pylist()
        assert ranks == [{"n": 11}]
    finally:
        engine.close()


def test_a_backfill_over_a_time_column_compares_its_range_with_what_landed_in_it(
    tmp_path: Path, pg_database: str
) -> None:
    """The control totals of a range over a non-key column are compared with the same range.

    Reproduction: capture orders (1000 rows, created_at one hour apart), then
    backfill --column created_at --from 2024-01-02 --to 2024-01-03
    --sum-column total: the source's 24 rows were compared with the whole
    lake's 1000 ("control mismatch", published anyway).
    """
    project = _make(tmp_path, pg_database, 1000)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders ADD COLUMN created_at timestamptz")
        conn.execute(
            "UPDATE orders SET created_at = "
            "timestamptz '2024-01-01 00:00+00' + id * interval '1 hour'"
        )
    engine = Engine.open(project)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        run = engine.backfill(
            "pg.orders",
            partitions=2,
            column="created_at",
            lower="2024-01-02",
            upper="2024-01-03",
            sum_column="total",
        )
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["orders"]["reconciliation"] == "reconciled"
        with engine.catalog.begin() as conn:
            event = cat.activity(conn, kind="reconciliation.control", limit=1)[0]
        assert event.body["control"]["rows"] == 24 and event.body["landed"]["rows"] == 24
        assert Decimal(event.body["landed"]["sum"]) == sum(Decimal(i) / 4 for i in range(24, 48))
    finally:
        engine.close()


def test_a_backfill_without_both_bounds_is_refused_before_a_run(
    tmp_path: Path, pg_database: str, tools
) -> None:
    """A backfill names its range: without --from and --to it is an exit-2 error, no Run.

    Reproduction: `combined backfill pg.orders --to 100` read from the
    table's start with no stated lower bound, in a Run.
    """
    _make(tmp_path, pg_database, 10)
    for bounds in ((), ("--to", "100"), ("--from", "1")):
        result = tools.cli(tmp_path, "backfill", "pg.orders", *bounds)
        assert result.returncode == 2, result.stderr
        assert "--from and --to are both required" in result.stderr
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        assert engine.runs() == []
    finally:
        engine.close()


def test_a_backfill_meets_the_drift_policy_as_a_capture_does(
    tmp_path: Path, pg_database: str
) -> None:
    project = _make(tmp_path, pg_database, 100)
    engine = Engine.open(project)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("ALTER TABLE orders DROP COLUMN note")
        # a dropped column fails by default: nothing is committed, the drift is in the feed
        run = engine.backfill("pg.orders", partitions=2, lower="1", upper="101")
        assert run.state == "needs_review", run.error
        assert "drop on field 'note' (policy: fail)" in (run.error or "")
        with engine.catalog.begin() as conn:
            (drift,) = cat.activity(conn, kind="drift")
        assert (drift.body["class"], drift.body["field"]) == ("drop", "note")
        notes = engine.sql("SELECT count(note) AS n FROM pg.orders").to_pylist()
        assert notes == [{"n": 100}]
    finally:
        engine.close()
    project.write_text(project.read_text() + "        drift: {drop: evolve}\n")
    engine = Engine.open(project)
    try:
        run = engine.backfill("pg.orders", partitions=2, lower="1", upper="101")
        assert run.state == "succeeded", run.error
        with engine.catalog.begin() as conn:
            outcomes = [e.body["outcome"] for e in cat.activity(conn, kind="drift")]
        assert sorted(outcomes) == ["evolve", "fail"]  # the accepted drift is in the feed too
    finally:
        engine.close()


def _keyed(tmp_path: Path, dsn: str, ddl: str, rows: str, key: str) -> Engine:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ddl)
        conn.execute(rows)
    project = PROJECT.replace("orders", "t").replace("key: [id]", f"key: [{key}]")
    (tmp_path / "combined.yaml").write_text(project.format(dsn=dsn))
    engine = Engine.open(tmp_path / "combined.yaml")
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    return engine


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone is not UTC (DuckDB takes it for TIMESTAMPTZ text)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("ddl", "rows", "key", "lower", "upper"),
    [
        # '0.7' as a real is 0.69999999: the source's range ends below that
        # row, the lake's ('0.7' as a double) above it, which deleted it.
        (
            "CREATE TABLE t (id real PRIMARY KEY, v int)",
            "INSERT INTO t SELECT (g / 10.0)::real, g FROM generate_series(1, 20) g",
            "id",
            "0.3",
            "0.7",
        ),
        # The source reads a bound without a zone in UTC, the lake read it in
        # the process's zone: rows of the hours between were deleted.
        (
            "CREATE TABLE t (at timestamptz, dev int, v int, PRIMARY KEY (at, dev))",
            "INSERT INTO t SELECT timestamptz '2024-01-01 00:00+00' + g * interval '1 hour',"
            " 1, g FROM generate_series(0, 100) g",
            "at, dev",
            "2024-01-02 00:00",
            "2024-01-03 00:00",
        ),
    ],
    ids=["real", "timestamptz"],
)
def test_a_range_backfill_deletes_nothing_outside_the_sources_range(
    tmp_path: Path,
    pg_database: str,
    new_york: None,
    ddl: str,
    rows: str,
    key: str,
    lower: str,
    upper: str,
) -> None:
    engine = _keyed(tmp_path, pg_database, ddl, rows, key)
    try:
        before = engine.sql("SELECT * FROM pg.t ORDER BY v").to_pylist()
        run = engine.backfill("pg.t", partitions=2, lower=lower, upper=upper)
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["t"]["deletes"] == 0
        assert run.stats["t"]["reconciliation"] == "reconciled"
        assert engine.sql("SELECT * FROM pg.t ORDER BY v").to_pylist() == before
    finally:
        engine.close()


def test_a_range_backfill_over_numbers_the_lake_keeps_as_text_is_refused(
    tmp_path: Path, pg_database: str
) -> None:
    # numeric without a precision lands as text, which orders '1500' between
    # '100' and '200': a range 100..200 took 1000..1999 for its own and
    # deleted them from the lake, reconciled. Refused before any Run.
    engine = _keyed(
        tmp_path,
        pg_database,
        "CREATE TABLE t (id numeric PRIMARY KEY, v int)",
        "INSERT INTO t SELECT g, g FROM generate_series(1, 3000) g",
        "id",
    )
    try:
        runs = len(engine.runs())
        with pytest.raises(ConfigError) as refused:
            engine.backfill("pg.t", partitions=2, lower="100", upper="200")
        assert "does not compare in the source's order" in refused.value.describe()
        assert "--column" in refused.value.describe()
        assert len(engine.runs()) == runs
        assert engine.sql("SELECT count(*) AS n FROM pg.t").to_pylist() == [{"n": 3000}]
        run = engine.backfill("pg.t", partitions=2, column="v", lower="100", upper="200")
        assert run.state == "succeeded", run.error
    finally:
        engine.close()


def test_a_column_renamed_before_or_after_a_backfill_is_judged_a_rename(
    tmp_path: Path, pg_database: str
) -> None:
    """A backfill judged drift without the columns' identities and recorded none.

    A column renamed before it was judged a drop and a new column (under
    ``rename: evolve`` the default ``drop: fail`` held the backfill), and one
    renamed after it was judged so by the next capture.
    """
    project = _make(tmp_path, pg_database, 100)
    project.write_text(project.read_text() + "        drift: {rename: evolve}\n")
    engine = Engine.open(project)
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("ALTER TABLE orders RENAME COLUMN note TO memo")
        run = engine.backfill("pg.orders", partitions=2, lower="1", upper="101")
        assert run.state == "succeeded", run.error
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("ALTER TABLE orders RENAME COLUMN memo TO remark")
            conn.execute("UPDATE orders SET remark = 'r' || id WHERE id <= 3")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with engine.catalog.begin() as conn:
            drift = [(e.body["class"], e.body["field"]) for e in cat.activity(conn, kind="drift")]
        assert sorted(drift) == [("rename", "memo"), ("rename", "remark")]
        lake = engine.sql("SELECT id, remark FROM pg.orders WHERE id <= 4 ORDER BY id").to_pylist()
        assert [r["remark"] for r in lake] == ["r1", "r2", "r3", "n4"]
    finally:
        engine.close()
