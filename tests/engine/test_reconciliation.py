"""Counts are reconciled before publication; a capture that does not reconcile is not published."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from combined.catalog import data as cat
from combined.engine import Engine


def test_a_cursor_capture_is_not_reconciled_against_the_source(tmp_path: Path, tools) -> None:
    tools.make(tmp_path)
    tools.sql(
        tmp_path,
        "CREATE TABLE log (id INTEGER PRIMARY KEY, v TEXT);"
        "INSERT INTO log (v) VALUES ('a'), ('b');",
    )
    text = (tmp_path / "combined.yaml").read_text() + (
        "      log:\n        key: [id]\n        strategy: cursor\n"
        "        cursor: {column: id, trust: 'rowid alias'}\n"
    )
    (tmp_path / "combined.yaml").write_text(text)
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.stats is not None
        assert run.stats["orders"]["reconciliation"] == "reconciled"
        assert run.stats["log"]["reconciliation"] == "not_reconciled"
    finally:
        engine.close()


def test_a_lake_changed_behind_the_catalog_is_not_published(shop: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    engine = Engine.open(shop / "combined.yaml")
    try:
        (first,) = engine.capture(["shop.orders"])
        path = shop / "lake" / "shop" / "orders"
        dt = DeltaTable(str(path))
        schema = pa.schema(dt.schema().to_arrow())
        stray = pa.Table.from_pylist(
            [{"id": 9999, "_combined_id": "f" * 32, "_combined_op": "insert"}], schema=schema
        )
        write_deltalake(str(path), stray, mode="append")  # a writer that is not Combined
        (run,) = engine.capture(["shop.orders"])
        assert run.state == "needs_review"
        # caught before anything is read or committed: the version chain still
        # describes what Combined committed, so restoring the table mends it
        assert "does not reconcile" in (run.error or "")
        assert "the lake holds 201 rows at lake version 1" in (run.error or "")
        assert "claims 200" in (run.error or "")
        assert "lake version 1 was written outside Combined" in (run.error or "")
        assert "restore(0)" in (run.error or "")
        assert DeltaTable(str(path)).version() == 1  # nothing committed
        assert engine.publications(1)[0]["id"] == first.publication_id
        with engine.catalog.begin() as conn:
            alerts = cat.activity(conn, kind="alert.reconciliation_failed")
        assert len(alerts) == 1
        assert (alerts[0].body["lake_rows"], alerts[0].body["version_rows"]) == (201, 200)
        assert alerts[0].body["foreign_lake_versions"] == [1]
        # capturing again changes nothing while the table holds the stray row
        (again,) = engine.capture(["shop.orders"])
        assert again.state == "needs_review" and "201 rows" in (again.error or "")
        # the way out the message gives: restore the table, capture again
        DeltaTable(str(path)).restore(0)
        (mended,) = engine.capture(["shop.orders"])
        assert mended.state == "succeeded", mended.error
        assert engine.sql("SELECT count(*) AS n FROM shop.orders").to_pylist() == [{"n": 200}]
        assert mended.stats is not None
        assert mended.stats["orders"]["reconciliation"] == "reconciled"
    finally:
        engine.close()


PG_PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      readings:
        relation: public.readings
        key: [id]
        control_sum: {column}
"""


def test_a_float_control_sum_summed_in_another_order_still_reconciles(
    tmp_path: Path, pg_database: str
) -> None:
    import psycopg

    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE readings (id int PRIMARY KEY, v float8, w float8)")
        for row in ((1, 1e16), (3, 1.0), (2, -1e16)):
            conn.execute("INSERT INTO readings VALUES (%s, %s, 1)", row)
    (tmp_path / "combined.yaml").write_text(PG_PROJECT.format(dsn=pg_database, column="v"))
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        with psycopg.connect(pg_database, autocommit=True) as conn:
            # Rewriting the heap in key order changes no row, but the order
            # PostgreSQL sums them in: 1e16 - 1e16 + 1.0 is 1.0, where the
            # lake's order (the former heap's) rounds the 1.0 away: 0.0.
            conn.execute("CLUSTER readings USING readings_pkey")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["readings"]["reconciliation"] == "reconciled"
        with engine.catalog.begin() as conn:
            event = cat.activity(conn, kind="reconciliation.control")[0]
        assert (event.body["control"]["sum"], event.body["landed"]["sum"]) == ("1", "0.0")
        assert event.body["ok"]
    finally:
        engine.close()


def test_a_float_sum_may_differ_by_its_rounding_only() -> None:
    from combined.quality import same_sum

    # the rounding allowed for float sums is no licence for a real difference
    assert same_sum("1.0000000001", "1.0", tolerance=1e-6)
    assert not same_sum("3.0", "1.0", tolerance=1e-6)
    assert not same_sum("1.0000000001", "1.0")  # exact types: exact sums
    assert same_sum("1.50", "1.5") and same_sum(None, None) and not same_sum("0", None)


CURSOR_PROJECT = """\
version: 1
lake: ./lake
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
    datasets:
      events:
        relation: public.events
        key: [id]
        strategy: cursor
        cursor: {{column: id, trust: "ids come from a sequence"}}
"""


def test_a_cursor_that_cannot_see_deletes_states_its_variance_and_alerts_once(
    tmp_path: Path, pg_database: str
) -> None:
    """Deleted rows are the cursor's expected variance, alerted when it changes (issue 23, #28).

    Reproduction: a cursor dataset whose source deleted rows raised
    ``alert.reconciliation_failed`` on every capture, for ever (126 alerts in
    125 runs), while the Run succeeded: capture, delete 3 rows, capture three
    times: three alerts, each a plain ``mismatch`` with no cause or remedy.
    """
    import psycopg

    with psycopg.connect(pg_database, autocommit=True) as pg:
        pg.execute("CREATE TABLE events (id int PRIMARY KEY, v text)")
        pg.execute("INSERT INTO events SELECT g, 'e' || g FROM generate_series(1, 20) g")
    (tmp_path / "combined.yaml").write_text(CURSOR_PROJECT.format(dsn=pg_database))
    engine = Engine.open(tmp_path / "combined.yaml")

    def alerts() -> list[dict[str, object]]:
        with engine.catalog.begin() as conn:
            return [a.body for a in cat.activity(conn, kind="alert.reconciliation_failed")]

    try:
        (run,) = engine.capture()
        assert run.stats is not None and run.stats["events"]["reconciliation"] == "reconciled"
        with psycopg.connect(pg_database, autocommit=True) as pg:
            pg.execute("DELETE FROM events WHERE id <= 3")
        for _ in range(3):
            (run,) = engine.capture()
            assert run.state == "succeeded", run.error
            assert run.stats is not None
            assert run.stats["events"]["reconciliation"] == "expected_variance"
        (alert,) = alerts()  # once, not on every capture
        assert alert["expected_variance"] == 3 and alert["previous_variance"] is None
        assert alert["source_status"] == "expected_variance"
        assert "cannot see deletes" in str(alert["remedy"])
        assert "strategy: cdc" in str(alert["remedy"])
        with engine.catalog.begin() as conn:
            last = cat.activity(conn, kind="reconciliation", limit=1)[0].body
        assert (last["lake_rows"], last["source_rows"], last["expected_variance"]) == (20, 17, 3)

        # the variance changes: one more alert, then quiet again
        with psycopg.connect(pg_database, autocommit=True) as pg:
            pg.execute("DELETE FROM events WHERE id = 10")
        engine.capture()
        engine.capture()
        assert [a["expected_variance"] for a in alerts()] == [4, 3]

        # the remedy the alert gives: a whole range read deletes what the source lost
        run = engine.backfill("pg.events", partitions=1, column="id", lower="1", upper="1000")
        assert run.state == "succeeded", run.error
        (run,) = engine.capture()
        assert run.stats is not None and run.stats["events"]["reconciliation"] == "reconciled"
        assert len(alerts()) == 2
    finally:
        engine.close()


def test_lake_nulls_count_from_the_log_or_the_files(tmp_path: Path) -> None:
    """Nulls per column: from the log's statistics, or read where a file has none."""
    from deltalake import write_deltalake

    from combined.lake import LakeTable
    from combined.quality._nulls import lake_nulls

    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3]}))  # before `flag` existed
    write_deltalake(
        str(path),
        pa.table({"id": [4, 5], "flag": pa.array([True, None])}),
        mode="append",
        schema_mode="merge",
    )
    table = LakeTable(path, "t")
    assert lake_nulls(table, 1, table.files(1), ["id", "flag", "gone"]) == {"flag": 4}
    # A filled column the lake never got is null in every row, not in none.
    assert lake_nulls(table, 1, table.files(1), ["flag", "gone"], absent=True) == {
        "flag": 4,
        "gone": 5,
    }
    first = [f for f in table.files(1) if "flag" not in pq.read_schema(path / f).names]
    assert lake_nulls(table, 1, first, ["flag"], absent=True) == {"flag": 3}
    write_deltalake(
        str(path), pa.table({"id": [6], "flag": pa.array([None], pa.bool_())}), mode="overwrite"
    )
    assert lake_nulls(table, 2, table.files(2), ["id", "flag"]) == {"flag": 1}


def test_nulls_the_source_cannot_have_make_the_source_side_a_mismatch(tmp_path: Path) -> None:
    """A NOT NULL column with nulls in the lake, and a filled column whose nulls differ.

    Reproduction (issue 23, #26): reconciliation compared counts only, so a
    lake holding NULL where the source had a value (a column added with a
    default the stream never carried) passed. End to end, the fill now
    leaves no such lake (tests/engine/test_cdc_fill.py); this checks the
    comparison itself on a real Delta table holding the defect.
    """
    from deltalake import write_deltalake

    from combined.lake import LakeTable
    from combined.quality._nulls import filled_check, null_check
    from combined.quality._reconcile import reconcile

    path = tmp_path / "t"
    write_deltalake(
        str(path), pa.table({"id": [1, 2, 3], "flag": pa.array([None, None, False], pa.bool_())})
    )
    table = LakeTable(path, "t")
    base = reconcile("pg.t", table, 0, 3, None)
    assert base.ok
    held = null_check(base, table, 0, ["id", "flag"])
    assert held.source_status == "mismatch" and held.not_null_violations == {"flag": 2}
    same = filled_check(base, table, 0, {"flag": 2})
    assert same.ok and same.filled_nulls == {"flag": {"source": 2, "lake": 2}}
    differ = filled_check(base, table, 0, {"flag": 0})
    assert differ.source_status == "mismatch"
    assert differ.filled_nulls == {"flag": {"source": 0, "lake": 2}}
