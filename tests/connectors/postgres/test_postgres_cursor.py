"""Cursor strategy: keyset pages, the upper bound in the data's snapshot, the lookback."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from combined.connectors.abc import CursorSpec
from combined.connectors.postgres import ControlTotals, PostgresSource
from combined.errors import ConfigError, SchemaMismatch


def _read_table(source, make_request, pgt, table="t", state=None, lookback=None, **kw):
    column = kw.pop("column", "updated_at")
    req = make_request(
        table,
        strategy="cursor",
        cursor=CursorSpec(
            column,
            lookback=lookback,
            trust=kw.pop("trust", "declared"),
            nulls=kw.pop("nulls", "fail"),
        ),
        state=state,
        **kw,
    )
    ext = source.read(req)
    try:
        messages = list(ext)
    finally:
        ext.finish("success")
    return pgt.table_of(messages), pgt.states(messages), ext


def _cursor_read(source, make_request, pgt, table="t", state=None, lookback=None, **kw):
    table_, states, ext = _read_table(source, make_request, pgt, table, state, lookback, **kw)
    ids = sorted(table_.column("id").to_pylist()) if table_.num_rows else []
    return ids, states, ext


@pytest.fixture
def ticks(admin, schema):
    """A table whose cursor repeats values, so pages split ties."""
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, updated_at timestamptz, v int)")
    admin.execute(
        f"INSERT INTO {schema}.t SELECT g, timestamptz '2024-01-01 00:00:00+00'"
        f" + (g / 10) * interval '1 minute', g FROM generate_series(1, 95) g"
    )
    return schema


def test_keyset_pages_hand_over_every_row_once(ticks, source, make_request, pgt):
    ids, states, ext = _cursor_read(
        source, make_request, pgt, batch_rows=4, options={"page_rows": 7}
    )
    assert ids == list(range(1, 96))  # ties across page edges neither lost nor doubled
    assert ext.receipt.rows == 95
    (final,) = states
    assert final.final
    assert final.state == {"cursor": "2024-01-01T00:09:00+00:00", "trust": "declared"}
    assert final.position == "2024-01-01T00:09:00+00:00"


def test_the_next_read_resumes_after_the_checkpoint(ticks, admin, source, make_request, pgt):
    _, (first,), _ = _cursor_read(source, make_request, pgt)
    admin.execute(
        f"INSERT INTO {ticks}.t VALUES (200, '2024-01-01 00:30:00+00', 0),"
        f" (201, '2024-01-01 00:31:00+00', 0)"
    )
    ids, (second,), _ = _cursor_read(source, make_request, pgt, state=first.state)
    assert ids == [200, 201]
    assert second.state["cursor"] == "2024-01-01T00:31:00+00:00"
    # A numeric lookback on a time cursor is seconds; the lower bound stays exclusive:
    # 60 s re-reads the rows at 00:09, 61 s those at 00:08 too.
    ids, _, _ = _cursor_read(source, make_request, pgt, state=first.state, lookback=60)
    assert ids == [*range(90, 96), 200, 201]
    ids, _, _ = _cursor_read(source, make_request, pgt, state=first.state, lookback=61)
    assert ids == [*range(80, 96), 200, 201]
    # Nothing new: the checkpoint stays where it was.
    ids, (third,), _ = _cursor_read(source, make_request, pgt, state=second.state)
    assert ids == [] and third.state == second.state


def test_a_row_committed_late_with_an_older_value_is_caught_by_the_lookback(
    admin, schema, source, make_request, pgt, pg_dsn
):
    admin.execute(
        f"CREATE TABLE {schema}.t (id int PRIMARY KEY,"
        f" updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )
    admin.execute(f"INSERT INTO {schema}.t (id) VALUES (1)")
    with psycopg.connect(pg_dsn) as slow:
        # The slow writer takes its cursor value now, but commits later.
        slow.execute(f"INSERT INTO {schema}.t (id) VALUES (2)")
        admin.execute(f"INSERT INTO {schema}.t (id) VALUES (3)")
        ids, (first,), _ = _cursor_read(source, make_request, pgt)
        assert ids == [1, 3]
        slow.commit()
    late = admin.execute(f"SELECT updated_at FROM {schema}.t WHERE id = 2").fetchone()[0]
    assert late < datetime.fromisoformat(first.state["cursor"])
    # Without a lookback the late row is lost: the documented limit of a cursor.
    ids, _, _ = _cursor_read(source, make_request, pgt, state=first.state)
    assert ids == []
    ids, (second,), _ = _cursor_read(
        source, make_request, pgt, state=first.state, lookback=timedelta(minutes=5)
    )
    assert ids == [1, 2, 3]  # rows 1 and 3 again: the overlap, made harmless by the key
    assert second.state == first.state  # never moved backwards


def test_the_upper_bound_is_read_in_the_datas_snapshot(ticks, admin, source, make_request, pgt):
    ext = source.read(
        make_request(
            "t",
            strategy="cursor",
            cursor=CursorSpec("updated_at"),
            batch_rows=10,
            options={"page_rows": 10},
        )
    )
    it = iter(ext)
    next(it)
    admin.execute(f"INSERT INTO {ticks}.t VALUES (500, '2030-01-01 00:00:00+00', 0)")
    rest = list(it)
    ext.finish("success")
    ids = [i for b in pgt.batches(rest) for i in b.column("id").to_pylist()]
    assert 500 not in ids and len(ids) == 85
    assert pgt.states(rest)[-1].state["cursor"] == "2024-01-01T00:09:00+00:00"


def test_integer_and_decimal_cursors_keep_json_exact_state(
    admin, schema, source, make_request, pgt
):
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, seq bigint, price numeric(12,3))")
    admin.execute(
        f"INSERT INTO {schema}.t SELECT g, g * 10, g + 0.125 FROM generate_series(1, 9) g"
    )
    ids, (by_seq,), _ = _cursor_read(source, make_request, pgt, column="seq")
    assert ids == list(range(1, 10)) and by_seq.state["cursor"] == 90
    ids, _, _ = _cursor_read(source, make_request, pgt, column="seq", state={"cursor": 70})
    assert ids == [8, 9]
    ids, _, _ = _cursor_read(
        source, make_request, pgt, column="seq", state={"cursor": 70}, lookback=15
    )
    assert ids == [6, 7, 8, 9]  # seq > 55
    _, (by_price,), _ = _cursor_read(source, make_request, pgt, column="price", trust="trigger")
    assert by_price.state == {"cursor": "9.125", "trust": "trigger"}
    assert by_price.position == "9.125"


def test_an_empty_relation_keeps_the_previous_checkpoint(admin, schema, source, make_request, pgt):
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, updated_at timestamptz)")
    ids, (final,), ext = _cursor_read(source, make_request, pgt)
    assert ids == [] and final.state == {} and final.position is None
    assert ext.receipt.completed
    prior = {"cursor": "2024-01-01T00:00:00+00:00", "trust": "declared"}
    _, (kept,), _ = _cursor_read(source, make_request, pgt, state=prior)
    assert kept.state == prior and kept.position == prior["cursor"]


def test_an_update_that_does_not_move_the_cursor_shows_in_control_totals(
    ticks, admin, source, make_request, pgt
):
    _, (first,), ext = _cursor_read(source, make_request, pgt, options={"control_totals": "v"})
    assert ext.control_totals == ControlTotals(95, "v", str(sum(range(1, 96))))
    # A bulk update that leaves updated_at alone: the cursor cannot see it.
    admin.execute(f"UPDATE {ticks}.t SET v = v + 1000 WHERE id <= 10")
    ids, _, again = _cursor_read(
        source, make_request, pgt, state=first.state, options={"control_totals": "v"}
    )
    assert ids == []
    # Reconciliation compares the relation's totals with what landed: they differ.
    assert again.control_totals == ControlTotals(95, "v", str(sum(range(1, 96)) + 10_000))


def test_cursor_reads_refuse_what_they_cannot_do(admin, schema, source, make_request):
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, name text, at timestamptz)")
    with pytest.raises(ConfigError, match="declares no key"):
        source.read(make_request("t", strategy="cursor", cursor=CursorSpec("at"), key=()))
    with pytest.raises(ConfigError, match="declares none"):
        source.read(make_request("t", strategy="cursor"))
    ext = source.read(make_request("t", strategy="cursor", cursor=CursorSpec("name")))
    with pytest.raises(ConfigError, match="cannot serve as a cursor"):
        list(ext)
    ext.finish("abort")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, 'a', %s)", (datetime.now(UTC),))
    ext = source.read(
        make_request(
            "t",
            strategy="cursor",
            cursor=CursorSpec("at", lookback=-5),
            state={"cursor": "2024-01-01T00:00:00+00:00"},
        )
    )
    with pytest.raises(ConfigError, match="negative"):
        list(ext)
    ext.finish("abort")


def _rows(source, make_request, pgt, table, columns, **kw):
    table_, _, _ = _read_table(
        source, make_request, pgt, table, batch_rows=4, options={"page_rows": 5}, **kw
    )
    return sorted(zip(*(table_.column(c).to_pylist() for c in columns), strict=True), key=repr)


def test_a_numeric_cursor_pages_in_number_order(admin, schema, source, make_request, pgt):
    # numeric is read as text: pages ordered by the select list's text
    # ('10' < '2') and compared as numbers lost rows 2..9.
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, seq numeric NOT NULL)")
    admin.execute(f"INSERT INTO {schema}.t SELECT g, g FROM generate_series(1, 20) g")
    ids, _, ext = _cursor_read(
        source, make_request, pgt, column="seq", batch_rows=4, options={"page_rows": 5}
    )
    assert ids == list(range(1, 21)) and ext.receipt.rows == 20


def test_an_enum_key_pages_in_the_enums_order(admin, schema, source, make_request, pgt):
    admin.execute(f"CREATE TYPE {schema}.mood AS ENUM ('sad', 'ok', 'happy')")
    admin.execute(
        f"CREATE TABLE {schema}.t (k {schema}.mood, n int, updated_at timestamptz NOT NULL,"
        " PRIMARY KEY (k, n))"
    )
    admin.execute(
        f"INSERT INTO {schema}.t SELECT m, g, '2024-01-01' FROM generate_series(1, 4) g,"
        f" unnest(enum_range(NULL::{schema}.mood)) m"
    )
    rows = _rows(source, make_request, pgt, "t", ["k", "n"], key=("k", "n"))
    expected = [(m, g) for m in ("sad", "ok", "happy") for g in range(1, 5)]
    assert rows == sorted(expected, key=repr)


def test_null_and_repeated_keys_at_page_edges_are_read_once_each(
    admin, schema, source, make_request, pgt
):
    # No unique index: keys repeat and hold NULLs, and every row shares one
    # cursor value, so page edges fall among equal and NULL keys.
    admin.execute(f"CREATE TABLE {schema}.t (id int, v int, updated_at timestamptz NOT NULL)")
    admin.execute(
        f"INSERT INTO {schema}.t SELECT CASE WHEN g % 3 = 0 THEN NULL ELSE g % 4 END, g,"
        " '2024-01-01' FROM generate_series(1, 23) g"
    )
    rows = _rows(source, make_request, pgt, "t", ["id", "v"])
    expected = [(None if g % 3 == 0 else g % 4, g) for g in range(1, 24)]
    assert rows == sorted(expected, key=repr)
    # A view has no index to prove its keys unique: it pages the same way.
    admin.execute(f"CREATE VIEW {schema}.w AS SELECT * FROM {schema}.t")
    assert _rows(source, make_request, pgt, "w", ["id", "v"]) == rows


def test_a_cast_cursor_or_key_pages_by_the_columns_own_values(
    admin, schema, source, make_request, pgt
):
    # A cast rounds what is read (1.003 -> 1.00): a page's last row compared
    # by its rounded value re-read the same page forever (cursor) or skipped
    # rows (key).
    admin.execute(f"CREATE TABLE {schema}.t (id numeric PRIMARY KEY, c numeric NOT NULL)")
    admin.execute(
        f"INSERT INTO {schema}.t SELECT g, 1 + g * 0.001 FROM generate_series(1, 20) g"
        f" UNION ALL SELECT 1 + g * 0.004, 7 FROM generate_series(1, 20) g"
    )
    for column, casts in (("c", {"id": "numeric(20,2)"}), ("c", {"c": "numeric(20,2)"})):
        req = make_request(
            "t",
            strategy="cursor",
            cursor=CursorSpec(column),
            batch_rows=2,
            options={"page_rows": 3, "casts": casts},
        )
        ext = source.read(req)
        try:
            messages = list(itertools.islice(ext, 200))  # a looping read never ends
        finally:
            ext.finish("abort")
        assert pgt.states(messages), f"the read with casts {casts} never ended"
        assert ext.receipt.rows == 40


@pytest.mark.parametrize(
    ("kind", "low", "top"),
    [
        ("double precision", "2", "NaN"),
        ("real", "2", "Infinity"),
        ("numeric", "2", "NaN"),
        ("timestamptz", "2024-01-01", "infinity"),
    ],
)
def test_a_cursor_value_above_every_value_is_refused_not_checkpointed(
    admin, schema, source, make_request, pgt, kind, low, top
):
    # NaN and infinity sort above every value: a float cursor checkpointed
    # there never compared a later row above it, and was stuck without a word.
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, c {kind})")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, %s), (2, %s)", (low, top))
    for state in (None, {"cursor": low}):
        with pytest.raises(SchemaMismatch, match="sorts above every value") as info:
            _read_table(source, make_request, pgt, state=state, column="c")
        assert "strategy: snapshot" in (info.value.hint or "")
    if kind in ("double precision", "real"):
        # A checkpoint already stored as NaN or infinity is refused too.
        admin.execute(f"DELETE FROM {schema}.t WHERE id = 2")
        with pytest.raises(SchemaMismatch, match="sorts above every value"):
            _read_table(source, make_request, pgt, state={"cursor": float(top)}, column="c")


@pytest.mark.parametrize(
    ("kind", "top"),
    [
        ("timestamptz", "12000-01-01 00:00+00"),
        ("date", "10000-01-01"),
        ("timestamp", "20000-06-01"),
    ],
)
def test_a_cursor_past_year_9999_says_how_to_capture_the_relation(
    admin, schema, source, make_request, pgt, kind, top
):
    # The hint said "bound the read explicitly", which no setting does.
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, c {kind})")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, '2024-01-01'), (2, %s)", (top,))
    with pytest.raises(SchemaMismatch, match="cannot bound a read") as info:
        _read_table(source, make_request, pgt, column="c")
    hint = info.value.hint or ""
    assert "strategy: snapshot" in hint and "view" in hint


def test_a_float_checkpoint_is_exact_whatever_the_servers_extra_float_digits(
    admin, schema, pg_dsn, make_request, pgt
):
    # A role or database may set extra_float_digits = 0 (15 digits): the
    # maximum 1 - 2**-52 read as '1' checkpointed 1.0, above a row written
    # later at 1 - 2**-53, which no read ever saw.
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, c double precision)")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, %s)", (1 - 2**-52,))
    dsn = pg_dsn + ("&" if "?" in pg_dsn else "?") + "options=-c%20extra_float_digits%3D0"
    source = PostgresSource({"dsn": dsn, "schemas": [schema]})
    try:
        ids, (first,), _ = _cursor_read(source, make_request, pgt, column="c")
        assert ids == [1] and first.state["cursor"] == 1 - 2**-52
        admin.execute(f"INSERT INTO {schema}.t VALUES (2, %s)", (1 - 2**-53,))
        ids, _, _ = _cursor_read(source, make_request, pgt, column="c", state=first.state)
        assert ids == [2]
    finally:
        source.close()


def test_a_unique_index_under_another_collation_does_not_prove_keys_tie_free(
    admin, schema, source, make_request, pgt
):
    # The column compares 'a1' and 'A1' equal; its unique index (under "C")
    # holds them apart. Pages trusted the index: a key tied with a page's
    # last row was skipped (32 of 40 rows read).
    admin.execute(
        f"CREATE COLLATION {schema}.ci (provider = icu, locale = 'und-u-ks-level2',"
        " deterministic = false)"
    )
    admin.execute(
        f"CREATE TABLE {schema}.t (v int, k text COLLATE {schema}.ci NOT NULL,"
        " updated_at timestamptz NOT NULL)"
    )
    admin.execute(f'CREATE UNIQUE INDEX ON {schema}.t (k COLLATE "C")')
    admin.execute(
        f"INSERT INTO {schema}.t SELECT g, CASE WHEN g % 2 = 0 THEN 'A' ELSE 'a' END"
        " || (g / 2), '2024-01-01' FROM generate_series(1, 40) g"
    )
    rows = _rows(source, make_request, pgt, "t", ["v"], key=("k",))
    assert sorted(v for (v,) in rows) == list(range(1, 41))


@pytest.fixture
def gaps(admin, schema):
    """A table whose cursor is NULL on every fifth row (no window reaches those)."""
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, updated_at timestamptz, v int)")
    admin.execute(
        f"INSERT INTO {schema}.t SELECT g, CASE WHEN g % 5 = 0 THEN NULL ELSE"
        f" timestamptz '2024-01-01 00:00:00+00' + (g / 10) * interval '1 minute' END, g"
        f" FROM generate_series(1, 40) g"
    )
    return schema


def test_a_null_cursor_fails_the_read_by_default(gaps, source, make_request, pgt):
    with pytest.raises(SchemaMismatch, match="8 rows of .* hold null in cursor column") as info:
        _cursor_read(source, make_request, pgt)
    assert info.value.context["rows"] == 8 and info.value.context["column"] == "updated_at"
    assert "cursor.nulls: include" in (info.value.hint or "")


def test_null_cursor_rows_included_are_read_in_the_snapshot_and_counted(
    gaps, admin, source, make_request, pgt
):
    req = make_request(
        "t",
        strategy="cursor",
        cursor=CursorSpec("updated_at", nulls="include"),
        batch_rows=4,
        options={"page_rows": 7, "control_totals": "v"},
    )
    ext = source.read(req)
    it = iter(ext)
    first = [next(it)]
    # Committed after the read's snapshot: neither read nor counted.
    admin.execute(f"INSERT INTO {gaps}.t VALUES (100, NULL, 100)")
    messages = first + list(it)
    ext.finish("success")
    ids = sorted(pgt.table_of(messages).column("id").to_pylist())
    assert ids == list(range(1, 41))
    assert ext.control_totals == ControlTotals(40, "v", str(sum(range(1, 41))))
    (final,) = pgt.states(messages)
    assert final.state["cursor"] == "2024-01-01T00:03:00+00:00"  # row 39 (40 is NULL)
    # A resumed read holds no window row, but every NULL row again (100 too).
    ids, _, again = _cursor_read(
        source,
        make_request,
        pgt,
        state=final.state,
        nulls="include",
        options={"control_totals": True},
    )
    assert ids == [5, 10, 15, 20, 25, 30, 35, 40, 100]
    assert again.control_totals == ControlTotals(41)


def test_a_relation_whose_cursor_is_all_null_is_read_when_included(
    admin, schema, source, make_request, pgt
):
    admin.execute(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, updated_at timestamptz)")
    admin.execute(f"INSERT INTO {schema}.t VALUES (1, NULL), (2, NULL)")
    ids, (final,), ext = _cursor_read(
        source, make_request, pgt, nulls="include", options={"control_totals": True}
    )
    assert ids == [1, 2] and final.state == {}
    assert ext.control_totals == ControlTotals(2)
    ids, (final,), ext = _cursor_read(
        source, make_request, pgt, nulls="exclude", options={"control_totals": True}
    )
    assert ids == [] and final.state == {}
    assert ext.control_totals == ControlTotals(0)


def test_null_cursor_rows_excluded_are_neither_read_nor_counted(gaps, source, make_request, pgt):
    ids, _, ext = _cursor_read(
        source, make_request, pgt, nulls="exclude", options={"control_totals": True}
    )
    assert ids == [i for i in range(1, 41) if i % 5]
    assert ext.control_totals == ControlTotals(32)
