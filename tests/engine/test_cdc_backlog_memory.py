"""A CDC backlog of updates that leave TOASTed values alone drains within the reduction's memory.

Such an update does not carry the out-of-line value; the capture fills it
from the row's earlier change or the lake. The fill once computed a window
over every staged row's full columns and joined the whole capture against
the lake: a backlog several times the reduction's memory failed with
DuckDB's "Out of Memory" (issue 25), and re-running failed the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
from tests._memory import anonymous_growth, duckdb_unused

from combined.capture import _output
from combined.capture._reduce import Reducer
from combined.engine import Engine
from combined.runtime import _memory

PROJECT = """\
version: 1
lake: ./lake
reduction_memory: 64MiB
sources:
  pg:
    connector: postgres
    config:
      dsn: {dsn}
      slot_prefix: {prefix}
    datasets:
      wide:
        relation: public.wide
        key: [id]
        strategy: cdc
"""

#: Rows of the wide table; at 64 MiB its backlog failed before the fix.
ROWS = 40_000

#: Every 20th row holds a 2-4 KB text stored out of line (EXTERNAL: never compressed inline).
FILL = """
INSERT INTO wide SELECT g, (g * 1.2345)::numeric(14,4), ARRAY['a' || g, NULL, 'b'],
  jsonb_build_object('k', g, 'v', 'x' || g, 'l', jsonb_build_array(1, 2, g)),
  md5(g::text)::uuid, date '2020-01-01' + (g % 1000)::int,
  timestamptz '2024-01-01' + g * interval '1 second', 0,
  CASE WHEN g % 20 = 0
    THEN (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 64 + g % 64) i)
    ELSE 'short ' || g END
FROM generate_series(1, {rows}) g
"""

#: The columns compared (a TOASTed value by its digest).
COMPARED = "id, amount, tags, doc, uid, d, ts, n, md5(body) AS body"


@pytest.fixture
def wide(tmp_path: Path, cdc_db) -> tuple[Path, str]:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE wide (id bigint PRIMARY KEY, amount numeric(14,4), tags text[], "
            "doc jsonb, uid uuid, d date, ts timestamptz, n int, body text)"
        )
        conn.execute("ALTER TABLE wide ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute(FILL.format(rows=ROWS))
    (tmp_path / "combined.yaml").write_text(PROJECT.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix))
    cdc_db.slot("public.wide")
    return tmp_path, cdc_db.dsn


def _rows(engine: Engine) -> list[tuple[object, ...]]:
    rows = engine.sql(f"SELECT {COMPARED} FROM pg.wide ORDER BY id").to_pylist()
    return [tuple(r.values()) for r in rows]


def _source(dsn: str) -> list[tuple[object, ...]]:
    # jsonb and uuid as the lake holds them: PostgreSQL's text.
    sql = COMPARED.replace("doc,", "doc::text,").replace("uid,", "uid::text,")
    with psycopg.connect(dsn) as conn:
        return list(conn.execute(f"SELECT {sql} FROM wide ORDER BY id"))


def test_a_backlog_of_toast_unchanged_updates_drains_in_a_small_reduction_memory(
    wide: tuple[Path, str],
) -> None:
    root, dsn = wide
    engine = Engine.open(root / "combined.yaml")
    try:
        (run,) = engine.capture()  # the stitched snapshot
        assert run.state == "succeeded", run.error
        with psycopg.connect(dsn, autocommit=True) as conn:
            # Every row changes a column beside the TOASTed one: those updates
            # name it unchanged. Some rows change twice, one of them after its
            # TOASTed value was replaced in the same backlog, and one moves to
            # another key.
            conn.execute("UPDATE wide SET n = n + 1")
            conn.execute("UPDATE wide SET body = repeat(md5('new'), 100) WHERE id = 40")
            conn.execute("UPDATE wide SET n = n + 1 WHERE id % 1000 = 0")
            conn.execute("UPDATE wide SET id = -id WHERE id = 60")
            conn.execute("UPDATE wide SET amount = 1 WHERE id = -60")
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        assert run.stats is not None
        assert run.stats["wide"]["updates"] == ROWS - 1
        lake, source = _rows(engine), _source(dsn)
    finally:
        engine.close()
    assert len(lake) == ROWS
    assert lake == source


#: Rows whose out-of-line text (4 KB each, ~100 MB in all) outgrows a 64 MiB reduction.
BIG_ROWS = 24_000


def _project(root: Path, cdc_db, table: str, memory: str | None) -> None:
    """The project of a cdc dataset over ``table``, at ``memory`` (None: the default)."""
    project = PROJECT.replace("wide:", f"{table}:").replace("public.wide", f"public.{table}")
    held = f"reduction_memory: {memory}\n" if memory else ""
    project = project.replace("reduction_memory: 64MiB\n", held)
    (root / "combined.yaml").write_text(project.format(dsn=cdc_db.dsn, prefix=cdc_db.prefix))


def _drain(
    root: Path,
    cdc_db,
    table: str,
    changes: list[str],
    check: str,
    *,
    default: bool = False,
    memory: str = "64MiB",
) -> tuple[Any, tuple[int, ...], tuple[int, ...]]:
    """Capture ``table``'s stitched snapshot, then ``changes``: the run, lake and source ``check``.

    ``default``: at the default reduction memory (else ``memory``).
    """
    _project(root, cdc_db, table, None if default else memory)
    cdc_db.slot(f"public.{table}")
    engine = Engine.open(root / "combined.yaml")
    try:
        (run,) = engine.capture()  # the stitched snapshot
        assert run.state == "succeeded", run.error
        with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
            for statement in changes:
                conn.execute(statement)
        (run,) = engine.capture()
        assert run.state == "succeeded", run.error
        (lake,) = [tuple(r.values()) for r in engine.sql(f"{check} FROM pg.{table}").to_pylist()]
    finally:
        engine.close()
    with psycopg.connect(cdc_db.dsn) as conn:
        source = conn.execute(f"{check} FROM {table}").fetchone()
    assert source is not None
    return run, tuple(int(v) for v in lake), tuple(int(v) for v in source)


def test_a_backlog_whose_unchanged_values_outgrow_the_reduction_memory_drains(
    tmp_path: Path, cdc_db
) -> None:
    # Every row's 4 KB text is left unchanged by the backlog, so every one is
    # filled from the lake: the fills alone are larger than the reduction's
    # memory. They once sat on the build side of the fill's hash joins (the
    # lake's values, then the fills joined to every staged row), and the
    # capture failed with DuckDB's "Out of Memory"; the joins now build on
    # ids and ordinals and the values stream past them.
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int, body text)")
        conn.execute("ALTER TABLE big ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute(
            "INSERT INTO big SELECT g, 0, repeat(md5(g::text), 128) "
            f"FROM generate_series(1, {BIG_ROWS}) g"
        )
    check = "SELECT count(*), sum(n), count(DISTINCT md5(body)), sum(length(body))"
    run, lake, source = _drain(tmp_path, cdc_db, "big", ["UPDATE big SET n = n + 1"], check)
    assert run.stats is not None and run.stats["big"]["updates"] == BIG_ROWS
    assert lake == source
    assert lake[0] == BIG_ROWS and lake[2] == BIG_ROWS


def _big_table(dsn: str, rows: int, chars: int) -> None:
    """``big(id, n, body)``: ``rows`` rows of ``chars``-character texts stored out of line."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int, body text)")
        conn.execute("ALTER TABLE big ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute(
            f"INSERT INTO big SELECT g, 0, repeat(md5(g::text), {chars // 32}) "
            f"FROM generate_series(1, {rows}) g"
        )


def _held_after_output(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes each reduction's DuckDB holds once its Deliveries' rows were all read."""
    held: list[int] = []
    output = Reducer.output

    def observed(self: Reducer, *args: Any, **kwargs: Any) -> Any:
        yield from output(self, *args, **kwargs)
        sql = "SELECT sum(memory_usage_bytes) FROM duckdb_memory()"
        held.append(int(self.con.execute(sql).fetchall()[0][0]))

    monkeypatch.setattr(Reducer, "output", observed)
    return held


def test_delivering_filled_rows_holds_little_of_the_reduction_memory(
    tmp_path: Path, cdc_db, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ~100 MB of unchanged texts filled from the lake, at the default memory:
    # the reduction gives DuckDB 72 MB, which its fills and transition filled
    # as a cache while the Deliveries read them a window at a time (the
    # process's peak: a 500k-row wide backlog peaked at 427 MB, over the 400
    # the issue allows). The Deliveries now run with 40 MB and hold less.
    _big_table(cdc_db.dsn, BIG_ROWS, 4096)
    held = _held_after_output(monkeypatch)
    check = "SELECT count(*), sum(n), count(DISTINCT md5(body)), sum(length(body))"
    run, lake, source = _drain(
        tmp_path, cdc_db, "big", ["UPDATE big SET n = n + 1"], check, default=True
    )
    assert run.stats is not None and run.stats["big"]["updates"] == BIG_ROWS
    assert lake == source and lake[2] == BIG_ROWS
    assert held[-1] <= 32 << 20, held  # (main: ~50 MB; here ~18)


def test_a_row_filled_with_a_value_larger_than_a_window_drains_at_the_default_memory(
    tmp_path: Path, cdc_db
) -> None:
    # A row's fills larger than a window of them (FILL_WINDOW_BYTES) are
    # delivered with the reduction's memory: 15 MB texts failed at 40 MB.
    _big_table(cdc_db.dsn, 3, 15 << 20)
    check = "SELECT count(*), sum(n), count(DISTINCT md5(body)), sum(length(body))"
    run, lake, source = _drain(
        tmp_path, cdc_db, "big", ["UPDATE big SET n = n + 1"], check, default=True
    )
    assert run.stats is not None and run.stats["big"]["updates"] == 3
    assert lake == source and lake[3] == 3 * (15 << 20)


#: List columns of a table whose every row a capture fills in each of them.
MANY_COLUMNS = 24


def test_rows_filled_in_many_columns_drain_at_the_default_memory(tmp_path: Path, cdc_db) -> None:
    # A column added with a default fills every other column of every row
    # from the lake. Each filled column is one more join in every statement
    # over the filled rows, and a join holds memory however few rows it
    # builds on (~6 MB for a list): 24 of them failed with DuckDB's "Out of
    # Memory" at the default reduction memory, for 50 rows.
    columns = ", ".join(f"c{i} int[]" for i in range(MANY_COLUMNS))
    values = ", ".join(f"ARRAY[g, {i}, NULL]" for i in range(MANY_COLUMNS))
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE many (id int PRIMARY KEY, {columns})")
        conn.execute(f"INSERT INTO many SELECT g, {values} FROM generate_series(1, 50) g")
    changes = [
        "ALTER TABLE many ADD COLUMN x int NOT NULL DEFAULT 5",
        "UPDATE many SET x = -1 WHERE id = 1",
    ]
    sums = ", ".join(f"sum(c{i}[1] + c{i}[2])" for i in range(MANY_COLUMNS))
    check = f"SELECT count(*), sum(x), {sums}"
    _, lake, source = _drain(tmp_path, cdc_db, "many", changes, check, default=True)
    assert lake == source and lake[:2] == (50, 49 * 5 - 1)


#: One out-of-line value of each kind, of 20 MB: larger than a quarter of the
#: default reduction memory's DuckDB could read from a lake file.
_MD5 = "md5(random()::text || i::text || g::text)"
LARGE_VALUES = {
    "text": f"(SELECT string_agg({_MD5}, '') FROM generate_series(1, {{n}} / 32) i)",
    "bytea": f"(SELECT string_agg(decode({_MD5}, 'hex'), ''::bytea) "
    "FROM generate_series(1, {n} / 16) i)",
    "jsonb": f"(SELECT jsonb_build_object('a', string_agg({_MD5}, '')) "
    "FROM generate_series(1, {n} / 32) i)",
}


@pytest.mark.parametrize("kind", sorted(LARGE_VALUES))
def test_a_value_larger_than_the_reductions_duckdb_memory_is_filled_at_the_default(
    tmp_path: Path, cdc_db, kind: str
) -> None:
    # An update beside one 20 MB out-of-line value, filled from the lake:
    # DuckDB's Parquet reader holds a value's page compressed, decompressed
    # and as a vector (~4.4 times its bytes, 89 MB for 20 MB of bytea), and
    # the fill failed with DuckDB's "Out of Memory" in its 64 MB. It now
    # reads it again with room for the lake's largest value of the column.
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE large (id bigint PRIMARY KEY, n int, body {kind})")
        conn.execute("ALTER TABLE large ALTER COLUMN body SET STORAGE EXTERNAL")
        value = LARGE_VALUES[kind].format(n=20 << 20)
        conn.execute(f"INSERT INTO large SELECT g, 0, {value} FROM generate_series(1, 2) g")
    body = "body::text" if kind == "jsonb" else "body"
    length = "octet_length" if kind == "bytea" else "length"
    check = f"SELECT count(*), sum(n), count(DISTINCT md5({body})), sum({length}({body}))"
    changes = ["UPDATE large SET n = n + 1"]
    run, lake, source = _drain(tmp_path, cdc_db, "large", changes, check, default=True)
    assert run.stats is not None and run.stats["large"]["updates"] == 2
    assert lake == source and lake[:3] == (2, 2, 2)


#: Rows of three 10 kB out-of-line texts each: 2,048 rows of their fills are 60 MB.
WIDE_FILL_ROWS = 2_500


@pytest.mark.parametrize("carrier", ["lake", "stream"])
def test_rows_whose_fills_are_tens_of_kb_drain_at_the_default_memory(
    tmp_path: Path, cdc_db, carrier: str
) -> None:
    # Updates that leave three 10 kB texts alone, their values carried by the
    # lake or by the inserts earlier in the stream. The fills' sizes were read
    # back from their table 2,048 rows at a time, 60 MB, and the capture
    # failed with DuckDB's "Out of Memory" at the default memory, every retry.
    texts = ", ".join(f"t{i} text" for i in range(3))
    values = ", ".join(
        f"(SELECT string_agg(md5(g::text || '{i}' || j::text), '') FROM generate_series(1, 320) j)"
        for i in range(3)
    )
    insert = f"INSERT INTO fat SELECT g, 0, {values} FROM generate_series(1, {WIDE_FILL_ROWS}) g"
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE fat (id bigint PRIMARY KEY, n int, {texts})")
        for i in range(3):
            conn.execute(f"ALTER TABLE fat ALTER COLUMN t{i} SET STORAGE EXTERNAL")
        if carrier == "lake":
            conn.execute(insert)
    changes = [insert] if carrier == "stream" else []
    sums = ", ".join(f"count(DISTINCT md5(t{i})), sum(length(t{i}))" for i in range(3))
    check = f"SELECT count(*), sum(n), {sums}"
    run, lake, source = _drain(
        tmp_path, cdc_db, "fat", [*changes, "UPDATE fat SET n = n + 1"], check, default=True
    )
    assert run.stats is not None
    assert lake == source and lake[:3] == (WIDE_FILL_ROWS, WIDE_FILL_ROWS, WIDE_FILL_ROWS)


#: Three arrays of 5,000 short strings, each kept out of line.
LISTS = ", ".join(
    f"(SELECT array_agg(i::text) FROM generate_series(1, 5000) i) AS a{j}" for j in range(3)
)
LISTS_CHECK = "SELECT count(*), sum(n), sum(cardinality(a0) + cardinality(a1) + cardinality(a2))"


def _lists(cdc_db, rows: int) -> None:
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE lists (id bigint PRIMARY KEY, n int, a0 text[], a1 text[], a2 text[])"
        )
        for column in ("a0", "a1", "a2"):
            conn.execute(f"ALTER TABLE lists ALTER COLUMN {column} SET STORAGE EXTERNAL")
        conn.execute(
            f"INSERT INTO lists SELECT g, 0, l.* FROM generate_series(1, {rows}) g, "
            f"(SELECT {LISTS}) l"
        )


def test_filled_lists_of_thousands_of_strings_drain_in_a_small_reduction_memory(
    tmp_path: Path, cdc_db
) -> None:
    # Updates leaving three arrays of 5,000 short strings alone, filled from
    # the rows inserted before them in the same backlog. Their fills' lookup
    # of the lake (for the lineages that start there: none) still read the
    # lake's lists, DuckDB's vectors of 143 rows of them, and the capture
    # failed for memory (its error: tests/runtime/test_reduce_errors.py).
    # The lake is read by Arrow now, only the row groups holding a wanted id.
    _lists(cdc_db, 300)
    run, lake, source = _drain(
        tmp_path,
        cdc_db,
        "lists",
        [
            "INSERT INTO lists SELECT id + 1000, n, a0, a1, a2 FROM lists",
            "UPDATE lists SET n = n + 1 WHERE id > 1000",
        ],
        LISTS_CHECK,
        memory="32MiB",
    )
    assert lake == source == (600, 300, 9_000_000)


def test_lists_of_thousands_of_strings_filled_from_the_lake_drain_at_the_default(
    tmp_path: Path, cdc_db
) -> None:
    # Every row's three arrays of 5,000 strings are left alone, so each is
    # filled from the lake. DuckDB read the lake's row group of 143 such rows
    # as 34 MB of vectors, and the fills failed for memory at the default
    # whatever room they were given; Arrow reads them now (capture/_lake_fills.py).
    _lists(cdc_db, 300)
    changes = ["UPDATE lists SET n = n + 1", "UPDATE lists SET n = n + 1 WHERE id % 7 = 0"]
    run, lake, source = _drain(tmp_path, cdc_db, "lists", changes, LISTS_CHECK, default=True)
    assert run.stats is not None and run.stats["lists"]["updates"] == 300
    assert lake == source == (300, 342, 4_500_000)


def _fills_growth(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The most the process's anonymous memory grows while each group of fills is made."""
    from combined.capture import _unchanged

    grown: list[int] = []
    fill_group = _unchanged._fill_group

    def watched(*args: Any, **kwargs: Any) -> Any:
        with anonymous_growth() as growth:
            made = fill_group(*args, **kwargs)
        grown.extend(growth)
        return made

    monkeypatch.setattr(_unchanged, "_fill_group", watched)
    return grown


#: Rows of a 1 MB out-of-line value each: 140 MB of values, ten rows a lake row group.
MB_ROWS = 140


@pytest.mark.beside  # (six backlogs of ~30 s: beside the parallel suite)
@pytest.mark.parametrize("carrier", ["lake", "stream"])
@pytest.mark.parametrize("kind", ["text", "jsonb", "bytea"])
def test_fills_of_large_values_hold_a_few_of_them_not_every_one(
    tmp_path: Path, cdc_db, monkeypatch: pytest.MonkeyPatch, kind: str, carrier: str
) -> None:
    # Updates leaving a 1 MB value alone in every row, each filled from the
    # lake or from the row's insert earlier in the backlog. DuckDB's scan of
    # the lake's files or of the staged rows, feeding the join that picks the
    # carriers, kept every value it read outside its memory limit until the
    # statement ended: 1,000 rows of 200 kB-1 MB JSON took the process to
    # 1 GB at the default settings (the limit: 150 MB). Arrow reads the
    # carriers' values now, a row group or a staged batch at a time.
    value = LARGE_VALUES[kind].format(n=1 << 20)
    insert = f"INSERT INTO large SELECT g, 0, {value} FROM generate_series(1, {MB_ROWS}) g"
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE large (id bigint PRIMARY KEY, n int, body {kind})")
        conn.execute("ALTER TABLE large ALTER COLUMN body SET STORAGE EXTERNAL")
        if carrier == "lake":
            conn.execute(insert)
    grown = _fills_growth(monkeypatch)
    body = "body::text" if kind == "jsonb" else "body"
    length = "octet_length" if kind == "bytea" else "length"
    check = f"SELECT count(*), sum(n), count(DISTINCT md5({body})), sum({length}({body}))"
    changes = (
        ["UPDATE large SET n = n + 1"]
        if carrier == "lake"
        else [insert, "UPDATE large SET n = n + 1"]
    )
    run, lake, source = _drain(tmp_path, cdc_db, "large", changes, check, default=True)
    assert run.stats is not None and run.stats["large"]["captured"] == len(changes) * MB_ROWS
    assert lake == source and lake[:3] == (MB_ROWS, MB_ROWS, MB_ROWS)
    (fills,) = grown
    # (the values: 140 MB; before, from the lake ~240 MB, from the stream ~185)
    assert fills < 112 << 20, f"{fills >> 20} MB"


#: Rows of a 3 MB out-of-line byte string each: ~100 MB of values.
BLOB_ROWS = 32


def _blobs(dsn: str) -> None:
    """``blobs(id, n, body)``: ``BLOB_ROWS`` rows of 3 MB byte strings stored out of line."""
    value = LARGE_VALUES["bytea"].format(n=3 << 20)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE blobs (id bigint PRIMARY KEY, n int, body bytea)")
        conn.execute("ALTER TABLE blobs ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute(
            f"INSERT INTO blobs SELECT g, 0, {value} FROM generate_series(1, {BLOB_ROWS}) g"
        )


def test_large_values_filled_from_the_lake_are_not_held_in_duckdb_while_delivered(
    tmp_path: Path, cdc_db, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Byte strings of megabytes left alone by every update, filled from the
    # lake at the default memory. Their fills were a table of the reduction's
    # database, whose values filled its buffer pool up to DuckDB's limit (and
    # spilled the rest) while the Deliveries read them a window at a time: a
    # backlog of 40 rows of 5-10 MB peaked at 491-514 MB. They are read from
    # the file Arrow wrote them to instead, and DuckDB holds next to nothing.
    _blobs(cdc_db.dsn)
    held = _held_after_output(monkeypatch)
    check = "SELECT count(*), sum(n), count(DISTINCT md5(body)), sum(octet_length(body))"
    run, lake, source = _drain(
        tmp_path, cdc_db, "blobs", ["UPDATE blobs SET n = n + 1"], check, default=True
    )
    assert run.stats is not None and run.stats["blobs"]["updates"] == BLOB_ROWS
    assert lake == source and lake[:3] == (BLOB_ROWS, BLOB_ROWS, BLOB_ROWS)
    assert held[-1] <= 16 << 20, f"{held[-1] >> 20} MB"  # (a table of the fills: ~80-100 MB)


def test_rows_of_large_values_are_delivered_a_row_group_each_leaving_duckdb_nothing_freed(
    tmp_path: Path, cdc_db, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 32 rows of 3 MB byte strings filled from the lake. A row group of the
    # Deliveries gathered 16 MB of rows (six of these) before its encoding,
    # and the output's statements left DuckDB's jemalloc holding the pages
    # they freed (a backlog of 5-10 MB values peaked at 471-489 MB): a row
    # group of such rows closes at 2 MB (one row), and DuckDB's freed pages
    # are given back after each statement.
    _blobs(cdc_db.dsn)
    # each purge of the output's statements, with DuckDB's freed bytes right after it
    purged: list[int] = []
    purge = _memory.purge_duckdb

    def observed() -> None:
        purge()
        purged.append(duckdb_unused())

    monkeypatch.setattr(_output, "purge_duckdb", observed)  # (as _output calls it)
    check = "SELECT count(*), sum(n), count(DISTINCT md5(body)), sum(octet_length(body))"
    run, lake, source = _drain(
        tmp_path, cdc_db, "blobs", ["UPDATE blobs SET n = n + 1"], check, default=True
    )
    assert run.stats is not None and run.stats["blobs"]["updates"] == BLOB_ROWS
    assert lake == source and lake[:3] == (BLOB_ROWS, BLOB_ROWS, BLOB_ROWS)
    metas = [pq.read_metadata(f) for f in (tmp_path / "lake").rglob("*.parquet")]
    groups = [
        m.row_group(g).num_rows
        for m in metas
        if "body" in m.schema.names
        for g in range(m.num_row_groups)
    ]
    assert sum(groups) >= 2 * BLOB_ROWS  # (the snapshot's files and the backlog's)
    assert max(groups) == 1, groups  # (before: 4-6 a row group)
    # Given back after the output's statements (the bytes DuckDB's jemalloc then holds
    # are no figure of this code: 3-4 MB alone, a constant 15-17 MB in a long-lived
    # xdist worker after hundreds of other tests; bench/RESULTS.md measures the peak).
    assert purged, "the output of rows of megabytes left DuckDB's freed pages to it"


#: Keys deleted and inserted again in one backlog: their apply-order checks failed at the default.
REINSERTED = 150_000


def test_keys_deleted_and_inserted_again_in_one_backlog_drain_at_the_default_memory(
    tmp_path: Path, cdc_db
) -> None:
    # Each such key is inserted while the lake holds it: the check that the
    # stream never inserts a key twice orders its changes, all of them at once
    # before, over DuckDB's share of the default memory (61 MB), which they
    # did not spill from: 150k such keys failed, and every retry alike.
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE redo (id bigint PRIMARY KEY, a int, s text)")
        conn.execute(
            f"INSERT INTO redo SELECT g, g, 'v' || g FROM generate_series(1, {REINSERTED + 100}) g"
        )
    again = f"SELECT g, -g, 'w' || g FROM generate_series(1, {REINSERTED}) g"
    changes = [
        f"BEGIN; DELETE FROM redo WHERE id <= {REINSERTED}; INSERT INTO redo {again}; COMMIT"
    ]
    check = "SELECT count(*), sum(id), sum(a), count(*) FILTER (WHERE s LIKE 'w%')"
    run, lake, source = _drain(tmp_path, cdc_db, "redo", changes, check, default=True)
    assert lake == source
    assert run.stats is not None and run.stats["redo"]["updates"] == REINSERTED


#: Rows of a deferrable key rotated through its own rows: failed at the default memory.
ROTATED = 300_000


def test_a_deferrable_key_rotated_through_every_row_drains_at_the_default_memory(
    tmp_path: Path, cdc_db
) -> None:
    # Under REPLICA IDENTITY FULL every row moves onto the key the next row
    # leaves, logged before that row's move away: every key is inserted while
    # held, and every delete applies before the insert logged ahead of it
    # (moved_out holds one a row). The apply order's window once joined the
    # whole of moved_out in the same statement, in the duplicate check and in
    # the reduction, and both overran DuckDB's share of the default memory.
    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE rot (id bigint PRIMARY KEY DEFERRABLE INITIALLY IMMEDIATE, a int)"
        )
        conn.execute("ALTER TABLE rot REPLICA IDENTITY FULL")
        conn.execute(f"INSERT INTO rot SELECT g, g FROM generate_series(1, {ROTATED}) g")
    changes = [f"UPDATE rot SET id = CASE WHEN id = {ROTATED} THEN 1 ELSE id + 1 END"]
    check = "SELECT count(*), sum(id), sum(a), sum(id * a)"
    run, lake, source = _drain(tmp_path, cdc_db, "rot", changes, check, default=True)
    assert lake == source
    assert run.stats is not None and run.stats["rot"]["updates"] == ROTATED


def test_a_backlog_adding_a_column_is_committed_by_a_streamed_rewrite(
    tmp_path: Path, cdc_db
) -> None:
    # A column added in the backlog widens the lake's schema. That commit went
    # through delta-rs' merge (merge_schema), which held the table and the
    # transition in memory: a 300k-row table's backlog peaked at 613-664 MB at
    # the defaults. It is now the copy-on-write rewrite a widened type takes,
    # streamed in the new schema (354 MB there; bench/RESULTS.md).
    from deltalake import DeltaTable

    with psycopg.connect(cdc_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE grown (id bigint PRIMARY KEY, a int)")
        conn.execute("INSERT INTO grown SELECT g, g FROM generate_series(1, 3000) g")
    changes = [
        "UPDATE grown SET a = a + 1",
        "ALTER TABLE grown ADD COLUMN c int",
        "UPDATE grown SET c = id WHERE id % 2 = 0",
        "DELETE FROM grown WHERE id % 7 = 0",
        "INSERT INTO grown SELECT g, g, -g FROM generate_series(3001, 3500) g",
    ]
    check = "SELECT count(*), sum(id), sum(a), count(c), sum(c)"
    run, lake, source = _drain(tmp_path, cdc_db, "grown", changes, check, default=True)
    assert run.state == "succeeded"
    assert lake == source
    (table,) = [p.parent for p in (tmp_path / "lake" / "pg").glob("grown*/_delta_log")]
    operations = [h["operation"] for h in DeltaTable(str(table)).history(1)]
    assert operations != ["MERGE"], "the widened schema was committed by delta-rs' merge"
