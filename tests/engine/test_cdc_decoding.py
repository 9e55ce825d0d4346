"""A change stream of every kind of value and change, decoded a batch at a time, equals its source.

The pgoutput rows are kept as their bytes and parsed into Arrow columns once
per batch (``connectors/postgres/_tuples.py``); arrays without quoted
elements are split by Arrow compute. Any decoding mistake (a value shifted,
a NULL read as an unchanged TOAST value or the reverse, an array element
lost, a numeric rounded, a key change missed) leaves the lake unlike the
source, which these tests compare column by column after a mixed backlog.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from psycopg.rows import dict_row

from combined.engine import Engine

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
      mixed:
        relation: public.mixed
        key: [id]
        strategy: cdc
"""

TABLE = """
CREATE TABLE mixed (
  id bigint PRIMARY KEY, i int, s smallint, flag bool, t text, vc varchar(20),
  amount numeric(20,6), free numeric, f8 float8, f4 real, d date, ts timestamp,
  tstz timestamptz, uid uuid, doc jsonb, js json, raw bytea,
  tags text[], nums int[], body text)
"""

#: Row ``g``: every column NULL on some rows, quoted and NULL array elements,
#: non-ASCII text, exact numerics, and every 10th row a 2-4 KB text kept out of line.
ROWS = """
INSERT INTO mixed SELECT g,
  CASE WHEN g % 7 = 0 THEN NULL ELSE g * 3 - 1000 END,
  (g % 300)::smallint, CASE WHEN g % 5 = 0 THEN NULL ELSE g % 2 = 0 END,
  CASE WHEN g % 11 = 0 THEN NULL WHEN g % 11 = 1 THEN '' ELSE 'tëxt ' || g || E'\\n"q"' END,
  'v' || g, (g * 1234.567891)::numeric(20,6) * CASE WHEN g % 2 = 0 THEN -1 ELSE 1 END,
  CASE WHEN g % 3 = 0 THEN NULL ELSE (g::numeric / 7)::numeric(30,20) END,
  CASE WHEN g % 13 = 0 THEN NULL ELSE g / 8.0 END, (g % 64) / 4.0,
  date '2000-02-28' + g, timestamp '1999-12-31 23:59:59.999999' + g * interval '1 minute',
  timestamptz '2024-06-30 22:00:00+02' + g * interval '1.5 seconds',
  md5(g::text)::uuid,
  CASE WHEN g % 9 = 0 THEN NULL
    ELSE jsonb_build_object('k', g, 'ü', 'x"' || g, 'l', jsonb_build_array(1.50, NULL, g)) END,
  CASE WHEN g % 9 = 1 THEN NULL ELSE ('{"b":  ' || g || ', "a": [1,  2]}')::json END,
  CASE WHEN g % 6 = 0 THEN NULL ELSE decode(md5(g::text), 'hex') END,
  CASE g % 6 WHEN 0 THEN NULL WHEN 1 THEN '{}'::text[]
    WHEN 2 THEN ARRAY['a b', 'c,d', 'NULL', NULL, E'q"\\\\', '{x}']
    ELSE ARRAY['a' || g, NULL, 'b'] END,
  CASE WHEN g % 4 = 0 THEN NULL ELSE ARRAY[g, NULL, -g] END,
  CASE WHEN g % 10 = 0
    THEN (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 64 + g % 64) i)
    ELSE 'short ' || g END
FROM generate_series({lo}, {hi}) g
"""


def _rows(lo: int, hi: int) -> str:
    return ROWS.replace("{lo}", str(lo)).replace("{hi}", str(hi))


COLUMNS = (
    "id, i, s, flag, t, vc, amount, free::text AS free, f8, f4, d, ts, tstz, "
    "uid::text AS uid, "
    "doc::text AS doc, js::text AS js, raw, tags, nums, md5(body) AS body"
)


@pytest.fixture
def mixed(tmp_path: Path, cdc_db) -> tuple[Path, str]:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(TABLE)
        conn.execute("ALTER TABLE mixed ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute(_rows(1, 600))
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix))
    cdc_db.slot("public.mixed")
    return tmp_path, cdc_db.dsn


def _lake(engine: Engine, columns: str) -> list[dict[str, object]]:
    # The lake holds numeric without a scale, uuid, jsonb and json as PostgreSQL's text.
    lake = columns.replace("::text AS", " AS")
    rows: list[dict[str, object]] = engine.sql(
        f"SELECT {lake} FROM pg.mixed ORDER BY id"
    ).to_pylist()
    return rows


def _source(dsn: str, columns: str) -> list[dict[str, object]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return list(conn.execute(f"SELECT {columns} FROM mixed ORDER BY id"))


def _same(lake: list[dict[str, object]], source: list[dict[str, object]]) -> None:
    """Assert equal rows, naming the first value that differs."""
    assert [r["id"] for r in lake] == [r["id"] for r in source]
    for mine, theirs in zip(lake, source, strict=True):
        assert mine.keys() == theirs.keys()
        for name, value in mine.items():
            assert value == theirs[name], (
                f"row {mine['id']} column {name}: lake {value!r}, source {theirs[name]!r}"
            )


def _capture(engine: Engine) -> None:
    (run,) = engine.capture()
    assert run.state == "succeeded", run.error


def test_a_mixed_backlog_of_every_type_lands_as_the_source_holds_it(
    mixed: tuple[Path, str],
) -> None:
    root, dsn = mixed
    engine = Engine.open(root / "combined.yaml")
    try:
        _capture(engine)  # the stitched snapshot
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(_rows(601, 2400))  # inserts, one transaction
            with conn.transaction():  # several changes of some rows in one transaction
                conn.execute("UPDATE mixed SET i = coalesce(i, 0) + 1")  # TOAST left unchanged
                conn.execute("UPDATE mixed SET body = NULL, t = NULL WHERE id % 50 = 0")
                conn.execute("UPDATE mixed SET tags = NULL, doc = 'null' WHERE id % 17 = 3")
            conn.execute("UPDATE mixed SET id = id + 100000 WHERE id % 97 = 0")  # key changes
            conn.execute("UPDATE mixed SET f4 = 0.25 WHERE id > 100000")  # after the move
            conn.execute("DELETE FROM mixed WHERE id % 31 = 4")
            for n in range(20):  # small transactions
                conn.execute("UPDATE mixed SET vc = %s WHERE id = %s", (f"x{n}", n * 7 + 1))
        _capture(engine)
        _same(_lake(engine, COLUMNS), _source(dsn, COLUMNS))
        with psycopg.connect(dsn, autocommit=True) as conn:
            # A new column (a relation message mid-stream), then a truncate
            # and rows after it, in the next backlog.
            conn.execute("ALTER TABLE mixed ADD COLUMN extra numeric(8,3)")
            conn.execute("UPDATE mixed SET extra = id / 8.0 WHERE id % 3 = 0")
            conn.execute("TRUNCATE mixed")
            conn.execute(_rows(5000, 5900))
            conn.execute("UPDATE mixed SET extra = -id, nums = '{}' WHERE id % 4 = 1")
        _capture(engine)
        columns = COLUMNS + ", extra"
        _same(_lake(engine, columns), _source(dsn, columns))
    finally:
        engine.close()


PARTITIONED = """
CREATE TABLE parts (id int NOT NULL, region text NOT NULL, qty int, note text,
                    PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE parts_eu PARTITION OF parts FOR VALUES IN ('eu');
CREATE TABLE parts_as (note text, qty int, region text NOT NULL, id int NOT NULL);
ALTER TABLE parts ATTACH PARTITION parts_as FOR VALUES IN ('as');
INSERT INTO parts SELECT g, (ARRAY['eu', 'as'])[1 + g % 2], g, 'n' || g
  FROM generate_series(1, 200) g;
"""


def test_key_changes_inside_partitions_land_as_the_source_holds_them(
    tmp_path: Path, cdc_db
) -> None:
    # A key change sends the old key: that row is decoded on its own, in a
    # partition of the table's column order as in one of another order.
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(PARTITIONED)
    project = PROJECT.replace("mixed:", "parts:").replace("public.mixed", "public.parts")
    project = project.replace("key: [id]", "key: [id, region]")
    (tmp_path / "combined.yaml").write_text(project.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix))
    cdc_db.slot("public.parts")
    query = "SELECT id, region, qty, note FROM {} ORDER BY id, region"
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _capture(engine)
        with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
            conn.execute("UPDATE parts SET id = id + 1000 WHERE id % 10 < 4")  # both partitions
            conn.execute("UPDATE parts SET qty = -qty, note = NULL WHERE id % 3 = 0")
            conn.execute("DELETE FROM parts WHERE id % 7 = 0")
        _capture(engine)
        lake = [tuple(r.values()) for r in engine.sql(query.format("pg.parts")).to_pylist()]
        with psycopg.connect(cdc_db.dsn) as conn:
            assert lake == list(conn.execute(query.format("parts")))
    finally:
        engine.close()


ARRAYS = """
CREATE TABLE arrs (id int PRIMARY KEY, stamps timestamptz[], words text[], days date[]);
"""
ARRAY_ROWS = """
INSERT INTO arrs SELECT g,
  CASE g % 5 WHEN 0 THEN NULL WHEN 1 THEN '{}'
    ELSE ARRAY[timestamptz '2024-06-30 22:00:00.5+02' + g * interval '1 s', NULL,
               timestamptz '1999-12-31 23:59:59+00'] END,
  CASE g % 4 WHEN 0 THEN ARRAY['', 'plain', NULL] WHEN 1 THEN '{}'
    ELSE ARRAY['two words ' || g, 'tëxt', 'tab' || chr(9) || 'x'] END,
  ARRAY[date '2000-02-29' + g]
FROM generate_series({lo}, {hi}) g
"""


def test_arrays_of_quoted_elements_stream_split_by_arrow_as_the_source_holds_them(
    tmp_path: Path, cdc_db
) -> None:
    # PostgreSQL quotes a timestamp element (its space) and a phrase: each
    # such column was parsed value by value in Python, a timestamptz[] column
    # streamed at 28 us a row against 7 for four timestamptz columns. An
    # element quoted for a space alone is now split by Arrow like an unquoted one.
    from combined.connectors.postgres._text import _plain_arrays

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(ARRAYS)
        conn.execute(ARRAY_ROWS.replace("{lo}", "1").replace("{hi}", "50"))
    project = PROJECT.replace("mixed:", "arrs:").replace("public.mixed", "public.arrs")
    (tmp_path / "combined.yaml").write_text(project.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix))
    cdc_db.slot("public.arrs")
    query = "SELECT id, stamps, words, days FROM {} ORDER BY id"
    engine = Engine.open(tmp_path / "combined.yaml")
    try:
        _capture(engine)
        with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
            conn.execute(ARRAY_ROWS.replace("{lo}", "51").replace("{hi}", "400"))
            conn.execute(
                "UPDATE arrs SET words = ARRAY['a b', NULL], stamps = '{}' WHERE id % 3 = 0"
            )
            texts = [
                r[0]
                for r in conn.execute(
                    "SELECT stamps::text FROM arrs UNION ALL SELECT words::text FROM arrs"
                )
            ]
        _capture(engine)
        lake = [tuple(r.values()) for r in engine.sql(query.format("pg.arrs")).to_pylist()]
        with psycopg.connect(cdc_db.dsn) as conn:
            assert lake == list(conn.execute(query.format("arrs")))
        assert len(lake) == 400
        wire = pa.array([None if t is None else t.encode() for t in texts], pa.binary())
        assert _plain_arrays(wire) is not None  # the stream's texts, split by Arrow
    finally:
        engine.close()
