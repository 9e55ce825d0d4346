"""A CDC table's column whose type changed: its values are read again (``_fill``).

``ALTER TABLE ... ALTER COLUMN ... TYPE`` rewrites every value in place (a
``USING`` expression, or a cast that changes the text: ``text`` to
``jsonb``, ``timestamp`` to ``timestamptz``) and logical decoding streams
none of it. Before this, the rows not changed afterwards kept their old
values in the lake and the capture succeeded, whether or not a change of
the table followed the ``ALTER``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.engine.test_cdc_fill import PROJECT as FILL_PROJECT

from combined.engine import Engine

PROJECT = FILL_PROJECT + "        drift: {{narrowed_type: evolve}}\n"

# (column, its values, the ALTER, the value 7 was made), for 20 rows g = 1..20
RETYPED = {
    "widened-using": ("v int", "g", "ALTER TABLE t ALTER COLUMN v TYPE bigint USING v * 10", "70"),
    "text-to-jsonb": (
        "v text",
        """'{"b": 1,   "a": ' || g || '}'""",
        "ALTER TABLE t ALTER COLUMN v TYPE jsonb USING v::jsonb",
        '{"a": 7, "b": 1}',
    ),
    "numeric-scale": (
        "v numeric(12,2)",
        "g + 0.25",
        "ALTER TABLE t ALTER COLUMN v TYPE numeric(12,1)",
        "7.3",
    ),
    "timestamp-to-timestamptz": (
        "v timestamp",
        "timestamp '2024-01-01' + g * interval '1 hour'",
        # the wall clock read in the session's zone: 07:00 in New York, 12:00 UTC
        "SET timezone = 'America/New_York'; ALTER TABLE t ALTER COLUMN v TYPE timestamptz",
        "2024-01-01 12:00:00+00",
    ),
}

SOURCE = "SELECT id, v::text, w FROM t ORDER BY id"


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _source(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        conn.execute("SET timezone = 'UTC'")
        return list(conn.execute(SOURCE))


def _lake(engine: Engine, dsn: str) -> list[tuple[Any, ...]]:
    """The lake's rows, each value printed by the source's own cast to text.

    Under ``narrowed_type: evolve`` the lake takes the new type; a decimal is
    printed at the source's scale, a timestamp as the instant in UTC.
    """
    rows = engine.sql("SELECT id, CAST(v AS VARCHAR) AS v, w FROM pg.t ORDER BY id").to_pylist()
    schema = engine.layout.dataset_table("pg", "t").schema()
    assert schema is not None
    kind = str(schema.field("v").type)
    cast = {"int64": "bigint", "string": "jsonb"}.get(kind, "text")
    if kind.startswith("decimal"):
        cast = "numeric(12,1)"
    elif kind.startswith("timestamp"):  # the instant in UTC
        cast = "timestamptz"
    with psycopg.connect(dsn) as conn:
        conn.execute("SET timezone = 'UTC'")
        return [
            (r["id"], conn.execute(f"SELECT %s::{cast}::text", (r["v"],)).fetchone()[0], r["w"])  # type: ignore[index]
            for r in rows
        ]


def _engine(
    tmp_path: Path, cdc_db: Any, column: str, values: str, key: tuple[str, str] = ("int", "g")
) -> Engine:
    """A captured table ``t (id, <column>, w)`` of 20 rows; ``key``: id's type and values."""
    _sql(
        cdc_db.dsn,
        f"CREATE TABLE t (id {key[0]} PRIMARY KEY, {column}, w int)",
        f"INSERT INTO t SELECT {key[1]}, {values}, g FROM generate_series(1, 20) g",
    )
    (tmp_path / "combined.yaml").write_text(
        PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, mode="incremental")
    )
    engine = Engine.open(tmp_path / "combined.yaml")
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error
    return engine


@pytest.mark.parametrize("touched", [True, False], ids=["a-change-follows", "no-change-follows"])
@pytest.mark.parametrize("case", list(RETYPED))
def test_a_column_whose_type_changed_is_read_again(
    tmp_path: Path, cdc_db: Any, case: str, touched: bool
) -> None:
    """Each row's value as the ALTER rewrote it, whether a change of the table
    follows the ALTER in the stream (its relation message shows the new type)
    or not (the run compares the catalog's types with the checkpoint's)."""
    column, values, alter, seventh = RETYPED[case]
    engine = _engine(tmp_path, cdc_db, column, values)
    try:
        # a change before the ALTER in the same run keeps its place before the fill
        _sql(cdc_db.dsn, "UPDATE t SET w = -2 WHERE id = 2", alter)
        if touched:
            _sql(cdc_db.dsn, "UPDATE t SET w = -1 WHERE id = 1", "DELETE FROM t WHERE id = 20")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert _lake(engine, cdc_db.dsn) == _source(cdc_db.dsn)
        assert _lake(engine, cdc_db.dsn)[6] == (7, seventh, 7)
        assert run.stats is not None and run.stats["t"]["updates"] == (19 if touched else 20)
        (again,) = engine.capture()  # read once: nothing is filled again
        assert again.state == "succeeded", again.error
        assert again.stats is not None and again.stats["t"]["captured"] == 0
        assert _lake(engine, cdc_db.dsn) == _source(cdc_db.dsn)
    finally:
        engine.close()


def test_a_type_change_that_keeps_every_value_changes_no_row(tmp_path: Path, cdc_db: Any) -> None:
    """``varchar(10)`` to ``varchar(20)``, and the key ``int`` to ``bigint``:
    the values are read again and found equal, so no row is updated (nor
    billed); the key's new type is not read again at all."""
    engine = _engine(tmp_path, cdc_db, "v varchar(10)", "'x' || g")
    try:
        _sql(
            cdc_db.dsn,
            "ALTER TABLE t ALTER COLUMN v TYPE varchar(20)",
            "ALTER TABLE t ALTER COLUMN id TYPE bigint",
        )
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None and run.stats["t"]["captured"] == 20
        assert run.stats["t"]["updates"] == 0
        assert engine.sql("SELECT count(*) AS n FROM pg.t WHERE v = 'x' || id").to_pylist() == [
            {"n": 20}
        ]
        (usage,) = (u for u in engine.usage() if u["dataset"] == "t")
        assert usage["updates"] == 0 and usage["mar"] == 20, usage  # the first capture's
    finally:
        engine.close()


PARTITIONED = """
CREATE TABLE t (id int NOT NULL, region text NOT NULL, v int, w int,
                PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE t_eu PARTITION OF t FOR VALUES IN ('eu');
CREATE TABLE t_us (w int, v int, region text NOT NULL, id int NOT NULL);
ALTER TABLE t ATTACH PARTITION t_us FOR VALUES IN ('us');
INSERT INTO t SELECT g, (ARRAY['eu', 'us'])[1 + g % 2], g, g FROM generate_series(1, 20) g;
"""


@pytest.mark.parametrize("touched", [True, False], ids=["a-change-follows", "no-change-follows"])
def test_a_partitioned_tables_column_whose_type_changed_is_read_again(
    tmp_path: Path, cdc_db: Any, touched: bool
) -> None:
    """The fill reads through the partitioned table, whose partitions hold their
    columns in other orders."""
    _sql(cdc_db.dsn, PARTITIONED)
    project = PROJECT.replace("key: [id]", "key: [id, region]")
    (tmp_path / "combined.yaml").write_text(
        project.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix, mode="incremental")
    )
    engine = Engine.open(tmp_path / "combined.yaml")
    query = "SELECT id, region, v, w FROM {} ORDER BY id"
    try:
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        _sql(cdc_db.dsn, "ALTER TABLE t ALTER COLUMN v TYPE bigint USING v * 10")
        if touched:
            _sql(cdc_db.dsn, "UPDATE t SET w = -1 WHERE id IN (1, 2)")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        lake = [tuple(r.values()) for r in engine.sql(query.format("pg.t")).to_pylist()]
        with psycopg.connect(cdc_db.dsn) as conn:
            assert lake == list(conn.execute(query.format("t")))
        assert lake[0] == (1, "us", 10, -1 if touched else 1)
    finally:
        engine.close()


def test_a_fill_of_a_column_changed_again_since_is_deferred(cdc_db: Any) -> None:
    """``v`` made bigint, a row changed (its relation message asks for a fill), then
    ``v`` made numeric: the fill read the values already numeric (``1.50``) and
    parsed them as bigint, and every capture after failed. The fill now checks
    the column's type under a lock and leaves it to the later type's fill."""
    from combined.connectors.postgres._connect import Settings
    from combined.connectors.postgres._fill import ColumnFill, FillDeferred

    _sql(
        cdc_db.dsn,
        "CREATE TABLE t (id int PRIMARY KEY, v numeric(30,2))",
        "INSERT INTO t VALUES (1, 1.5)",
    )
    fill = ColumnFill(Settings(cdc_db.dsn))
    with pytest.raises(FillDeferred):
        list(fill("public.t", ["id", "v"], {"v": (20, -1)}))  # bigint, as the message showed
    numeric = (1700, (30 << 16 | 2) + 4)
    assert list(fill("public.t", ["id", "v"], {"v": numeric})) == [(b"1", b"1.50")]


def test_a_key_whose_identities_changed_type_is_refused(tmp_path: Path, cdc_db: Any) -> None:
    """A ``timestamp`` key made ``timestamptz``: every identity changed (an instant
    is another family than a wall clock), and an update of a row landed as a new
    row beside the old. The capture now fails, naming the key, before a commit."""
    hours = ("timestamp", "timestamp '2024-01-01' + g * interval '1 hour'")
    engine = _engine(tmp_path, cdc_db, "v int", "g", key=hours)
    try:
        _sql(cdc_db.dsn, "ALTER TABLE t ALTER COLUMN id TYPE timestamptz", "UPDATE t SET w = -1")
        (run,) = engine.capture()
        assert run.state == "needs_review"  # (only a new snapshot mends it)
        assert "key column 'id'" in (run.error or "") and "cdc setup" in (run.error or "")
        assert engine.sql("SELECT count(*) AS n FROM pg.t").to_pylist() == [{"n": 20}]
    finally:
        engine.close()


@pytest.mark.parametrize(
    "alter",
    [
        "ALTER TABLE t ALTER COLUMN v TYPE text",
        "ALTER TABLE t ALTER COLUMN v TYPE bool USING v > 10",
    ],
    ids=["int-to-text", "int-to-bool"],
)
def test_a_change_before_a_type_change_into_another_family_names_the_way_out(
    tmp_path: Path, cdc_db: Any, alter: str
) -> None:
    """A change of ``v`` made before an ``ALTER`` into another family, in one
    capture: the stream holds ``v`` in two types, which one capture cannot
    land, and every retry meets the same stream. The hint said "fix the value
    in the source, or declare the column's type to match", neither of which a
    cdc dataset can do; it now names the new snapshot, which lands the source."""
    from combined import cdc

    engine = _engine(tmp_path, cdc_db, "v int", "g")
    try:
        _sql(cdc_db.dsn, "UPDATE t SET v = -v WHERE id = 2", alter, "UPDATE t SET w = -1")
        (run,) = engine.capture()
        assert run.state == "needs_review"
        error = run.error or ""
        assert "'v'" in error and "fix the value in the source" not in error
        assert "`combined cdc teardown`, then `combined cdc setup`" in error, error
        cdc.teardown(engine, "pg")
        _, again = cdc.setup(engine, "pg")
        assert again.state == "succeeded", again.error
        assert _lake(engine, cdc_db.dsn) == _source(cdc_db.dsn)
    finally:
        engine.close()
