"""Discovery: relations per schema, columns, keys, cursor evidence, row estimates."""

from __future__ import annotations

import pytest

from combined.connectors.postgres import PostgresSource
from combined.connectors.postgres._catalog import parse_relation, relation_name
from combined.errors import ConfigError, NotFoundError

SETUP = """
CREATE TABLE {s}.orders (
  id bigserial PRIMARY KEY,
  code text NOT NULL,
  region int,
  placed_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz,
  qty int,
  CONSTRAINT orders_code UNIQUE (code)
);
CREATE UNIQUE INDEX orders_qty_partial ON {s}.orders (qty) WHERE qty > 1000;
CREATE INDEX orders_updated ON {s}.orders (updated_at);
CREATE FUNCTION {s}.touch() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN NEW.updated_at := now(); RETURN NEW; END $$;
CREATE TRIGGER orders_touch BEFORE INSERT OR UPDATE ON {s}.orders
  FOR EACH ROW EXECUTE FUNCTION {s}.touch();
CREATE TABLE {s}.events (eid int GENERATED ALWAYS AS IDENTITY, at timestamp, n int);
CREATE VIEW {s}.big_orders AS SELECT id, qty FROM {s}.orders WHERE qty > 10;
CREATE MATERIALIZED VIEW {s}.order_counts AS
  SELECT region, count(*) AS n FROM {s}.orders GROUP BY 1;
CREATE TABLE {s}.measures (day date NOT NULL, v int) PARTITION BY RANGE (day);
CREATE TABLE {s}.measures_2024 PARTITION OF {s}.measures
  FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
CREATE TABLE {s}."Mixed.Case" (id int);
CREATE TABLE {s}.odd (id int, r int4range);
INSERT INTO {s}.orders (code, region, qty) SELECT 'c' || g, g % 5, g FROM generate_series(1, 300) g;
ANALYZE {s}.orders;
"""


@pytest.fixture
def discovery(admin, schema, source):
    admin.execute(SETUP.format(s=schema))
    return source.discover()


def test_lists_tables_views_and_partitioned_parents_but_not_partitions(discovery, schema):
    kinds = {d.name: d.kind for d in discovery.datasets}
    assert kinds == {
        f"{schema}.orders": "table",
        f"{schema}.events": "table",
        f"{schema}.big_orders": "view",
        f"{schema}.order_counts": "materialized_view",
        f"{schema}.measures": "table",
        f'{schema}."Mixed.Case"': "table",
        f"{schema}.odd": "table",
    }
    assert discovery.connector == "postgres" and discovery.revision == "1"


def test_columns_keys_and_estimates(discovery, schema):
    orders = discovery.dataset(f"{schema}.orders")
    assert orders is not None
    assert [(f.name, f.arrow_type, f.source_type, f.nullable) for f in orders.fields] == [
        ("id", "int64", "bigint", False),
        ("code", "string", "text", False),
        ("region", "int32", "integer", True),
        ("placed_at", "timestamp[us, tz=UTC]", "timestamp with time zone", False),
        ("updated_at", "timestamp[us, tz=UTC]", "timestamp with time zone", True),
        ("qty", "int32", "integer", True),
    ]
    assert orders.primary_key == ("id",)
    # A partial unique index is not a key of the whole relation.
    assert orders.unique_keys == (("code",),)
    assert orders.estimated_rows == 300
    view = discovery.dataset(f"{schema}.big_orders")
    assert view is not None and view.estimated_rows is None and view.primary_key == ()
    odd = discovery.dataset(f"{schema}.odd")
    assert odd is not None and [f.arrow_type for f in odd.fields] == ["int32", "unsupported"]


def test_cursor_candidates_state_only_catalog_evidence(discovery, schema):
    orders = discovery.dataset(f"{schema}.orders")
    assert orders is not None
    evidence = {c.column: c.evidence for c in orders.cursor_candidates}
    assert set(evidence) == {"id", "placed_at", "updated_at"}  # never region or qty
    assert "nextval(" in evidence["id"] and "leads btree index orders_pkey" in evidence["id"]
    assert "default now()" in evidence["placed_at"]
    assert "no btree index leads with it" in evidence["placed_at"]
    assert "trigger orders_touch" in evidence["updated_at"]
    assert "cannot prove" in evidence["updated_at"]
    assert "nullable" in evidence["updated_at"] and "lookback" in evidence["updated_at"]
    events = discovery.dataset(f"{schema}.events")
    assert events is not None
    assert [c.column for c in events.cursor_candidates] == ["eid"]
    assert "GENERATED ALWAYS" in events.cursor_candidates[0].evidence
    assert events.strategies == ("snapshot", "cursor")


def test_discovered_names_read_back(discovery, schema, source, make_request, pgt):
    mixed = discovery.dataset(f'{schema}."Mixed.Case"')
    assert mixed is not None
    ext = source.read(make_request("x", relation=mixed.relation, key=()))
    try:
        assert pgt.table_of(list(ext)).num_rows == 0
    finally:
        ext.finish("success")


def test_relation_names_parse_literally():
    assert parse_relation("orders") == ("public", "orders")
    assert parse_relation("Sales.Orders") == ("Sales", "Orders")
    assert parse_relation('"a.b"."c""d"') == ("a.b", 'c"d')
    assert parse_relation(relation_name("a.b", 'c"d')) == ("a.b", 'c"d')
    for bad in ("a.b.c", "", "a.", '"open'):
        with pytest.raises(ConfigError):
            parse_relation(bad)


def test_a_missing_relation_is_not_found(source, make_request):
    ext = source.read(make_request("nope"))
    with pytest.raises(NotFoundError, match="nope"):
        list(ext)
    assert ext.finish("abort").cleanup_succeeded


def test_check_confirms_the_schemas(pg_dsn, schema):
    PostgresSource({"dsn": pg_dsn, "schemas": [schema]}).check()
    with pytest.raises(ConfigError, match="no_such_schema"):
        PostgresSource({"dsn": pg_dsn, "schemas": [schema, "no_such_schema"]}).check()


FAMILY = """
CREATE TABLE {s}.measures (id int, day date NOT NULL, v int, PRIMARY KEY (id, day))
  PARTITION BY RANGE (day);
CREATE TABLE {s}.measures_2024 PARTITION OF {s}.measures
  FOR VALUES FROM ('2024-01-01') TO ('2025-01-01') PARTITION BY RANGE (day);
CREATE TABLE {s}.measures_2024_h1 PARTITION OF {s}.measures_2024
  FOR VALUES FROM ('2024-01-01') TO ('2024-07-01');
CREATE TABLE {s}.measures_2024_h2 PARTITION OF {s}.measures_2024
  FOR VALUES FROM ('2024-07-01') TO ('2025-01-01');
CREATE TABLE {s}.measures_rest PARTITION OF {s}.measures DEFAULT;
INSERT INTO {s}.measures SELECT g, DATE '2024-01-01' + g, g FROM generate_series(1, 500) g;
CREATE TABLE {s}.animals (id int PRIMARY KEY, name text);
CREATE TABLE {s}."dogs.old" (breed text) INHERITS ({s}.animals);
CREATE TABLE {s}.cats () INHERITS ({s}.animals);
INSERT INTO {s}.animals VALUES (1, 'generic');
INSERT INTO {s}."dogs.old" SELECT g, 'd', 'b' FROM generate_series(2, 21) g;
INSERT INTO {s}.cats VALUES (30, 'tom');
-- what autovacuum does: it never analyzes a partitioned table itself
ANALYZE {s}.measures_2024_h1, {s}.measures_2024_h2, {s}.measures_rest;
ANALYZE {s}.animals, {s}."dogs.old", {s}.cats;
"""


def test_partitioned_and_inheritance_parents_say_what_their_reads_include(admin, schema, source):
    # Every table's estimate was its own reltuples: -1 (no estimate) for a
    # partitioned table, and the parent's own rows for an inheritance parent,
    # whose reads return its children's; nothing said a child's rows are
    # captured twice when it is captured next to its parent.
    admin.execute(FAMILY.format(s=schema))
    found = {d.name: d for d in source.discover().datasets}
    assert set(found) == {
        f"{schema}.measures",
        f"{schema}.animals",
        f'{schema}."dogs.old"',
        f"{schema}.cats",
    }
    measures = found[f"{schema}.measures"]
    assert measures.kind == "table" and measures.primary_key == ("id", "day")
    assert measures.estimated_rows == 500
    assert measures.notes == (
        "partitioned table: a read returns the rows of its 2 partitions, "
        "which are not listed on their own",
    )
    animals = found[f"{schema}.animals"]
    assert animals.estimated_rows == 22
    (note,) = animals.notes
    assert note.startswith(f'inheritance parent of {schema}.cats, {schema}."dogs.old": ')
    assert "capture it or them, not both" in note and "cdc is refused" in note
    (note,) = found[f'{schema}."dogs.old"'].notes
    assert note.startswith(f"inherits from {schema}.animals, whose reads return")
    assert found[f"{schema}.cats"].estimated_rows == 1


@pytest.mark.parametrize(
    ("ddl", "told", "fix"),
    [
        ("CREATE VIEW {t} AS SELECT 1 AS id", "{s}.t is a view", "strategy: snapshot"),
        (
            "CREATE MATERIALIZED VIEW {t} AS SELECT 1 AS id",
            "{s}.t is a materialized view",
            "cursor",
        ),
        ("CREATE UNLOGGED TABLE {t} (id int PRIMARY KEY)", "{s}.t is UNLOGGED", "SET LOGGED"),
        (
            "CREATE TABLE {t} (id int PRIMARY KEY); ALTER TABLE {t} REPLICA IDENTITY NOTHING",
            "{s}.t has REPLICA IDENTITY NOTHING",
            "REPLICA IDENTITY DEFAULT (its primary key), or ALTER TABLE",
        ),
        ("CREATE TABLE {t} (id int)", "{s}.t has no replica identity", "add a primary key"),
        (
            "CREATE TABLE {t} (id int PRIMARY KEY); CREATE TABLE {t}_kid () INHERITS ({t})",
            "table {s}.t has inheritance children ({s}.t_kid)",
            "each child table as a cdc dataset of its own",
        ),
        (
            "CREATE TABLE {t} (id int NOT NULL, r text) PARTITION BY LIST (r); "
            "CREATE TABLE {t}_eu PARTITION OF {t} FOR VALUES IN ('eu'); "
            "ALTER TABLE {t} REPLICA IDENTITY FULL",
            "partition {s}.t_eu of {s}.t has no replica identity",
            "REPLICA IDENTITY FULL",
        ),
    ],
    ids=[
        "view",
        "materialized-view",
        "unlogged",
        "identity-nothing",
        "no-key",
        "inheritance-parent",
        "partition-without-identity",
    ],
)
def test_check_refuses_a_cdc_relation_no_slot_streams(
    admin, schema, source, make_request, ddl, told, fix
):
    """`combined check` passed them; the capture then failed with "table not
    found", the server's bare "cannot add relation to publication", or a hint
    to add the primary key the table had. An inheritance parent, or a
    partitioned table with a partition that has no replica identity, passed
    too, and every capture then failed its Run (exit 1, as if a retry could help)."""
    for statement in ddl.format(t=f'"{schema}".t').split("; "):
        admin.execute(statement)
    with pytest.raises(ConfigError) as caught:
        source.preflight([make_request("t", strategy="cdc")])
    told = told.format(s=schema)
    assert f"cdc dataset 't': {told}" in caught.value.message
    assert fix in (caught.value.hint or "")
    source.preflight([make_request("t")])  # a snapshot reads it


def test_an_identity_hint_gives_the_statement_of_the_unique_index_that_would_serve(
    admin, schema, source, make_request
):
    """A cdc dataset of a table without a primary key but with a unique index over NOT
    NULL columns was told "add a primary key, or ... REPLICA IDENTITY FULL", never the
    index; one keyed on a unique column outside the identity, "make the key the replica
    identity", without the statement. Each hint now gives it, run as given."""
    s = f'"{schema}"'
    for statement in (
        f"CREATE TABLE {s}.t (a int NOT NULL, b int NOT NULL, c int, d int NOT NULL,"
        " email text NOT NULL, CONSTRAINT t_d UNIQUE (d) DEFERRABLE)",
        f"CREATE UNIQUE INDEX t_c ON {s}.t (c)",  # over a nullable column
        f"CREATE UNIQUE INDEX t_a ON {s}.t (a) WHERE a > 0",  # partial
        f"CREATE UNIQUE INDEX t_lower ON {s}.t (lower(email))",  # an expression
        f"CREATE UNIQUE INDEX t_ab ON {s}.t (a, b)",
        f'CREATE UNIQUE INDEX "t Email" ON {s}.t (email)',
        f"CREATE TABLE {s}.u (id int PRIMARY KEY, email text NOT NULL UNIQUE)",
    ):
        admin.execute(statement)

    def hint(table: str, *key: str) -> str:
        with pytest.raises(ConfigError) as caught:
            source.preflight([make_request(table, key=key, strategy="cdc")])
        return caught.value.hint or ""

    alter = f'ALTER TABLE "{schema}"."t" REPLICA IDENTITY'
    assert hint("t", "a") == f'{alter} USING INDEX "t_ab", or {alter} FULL'
    assert hint("t", "c") == f"add a primary key, or {alter} FULL"  # no index would do
    assert hint("t", "email") == f'{alter} USING INDEX "t Email", or {alter} FULL'
    admin.execute(hint("t", "email").split(", or ")[0])
    source.preflight([make_request("t", key=("email",), strategy="cdc")])
    # A key outside the identity: the index over the key, which the identity then is.
    alter = f'ALTER TABLE "{schema}"."u" REPLICA IDENTITY'
    assert hint("u", "email") == f'{alter} USING INDEX "u_email_key", or {alter} FULL'
    admin.execute(hint("u", "email").split(", or ")[0])
    source.preflight([make_request("u", key=("email",), strategy="cdc")])
    assert hint("u", "id") == f"{alter} DEFAULT (its primary key), or {alter} FULL"


def test_a_preflight_of_many_datasets_reads_the_catalog_in_a_few_queries(
    admin, schema, source, make_request, monkeypatch
):
    """Three queries a dataset (its relation, columns and types) cost ~10 ms a table:
    a source of hundreds of small tables waited seconds before its Run began."""
    from combined.connectors.postgres import _connect

    for n in range(40):
        admin.execute(f'CREATE TABLE "{schema}".t{n} (id int PRIMARY KEY, v text, a int[])')
    admin.execute(f'CREATE TABLE "{schema}"."Mixed.Case" (id int PRIMARY KEY, r int4range)')
    queries: list[str] = []
    rows = _connect.Session.rows

    def counted(self, query, what, *args, **kwargs):
        queries.append(what)
        return rows(self, query, what, *args, **kwargs)

    monkeypatch.setattr(_connect.Session, "rows", counted)
    requests = [make_request(f"t{n}") for n in range(40)]
    source.preflight(requests)
    assert len(queries) <= 5, queries
    # the checks still see each relation's own columns: an uncast range, the 41st
    mixed = make_request("m", relation=f'{schema}."Mixed.Case"')
    with pytest.raises(ConfigError, match="int4range"):
        source.preflight([*requests, mixed])
    missing = make_request("gone", relation=f"{schema}.gone")
    with pytest.raises(NotFoundError, match=f"relation '{schema}.gone' does not exist"):
        source.preflight([*requests, missing, mixed])


def test_a_table_without_columns_is_refused_before_any_run(admin, schema, source, make_request):
    """Its capture (key: [], rows told by their content) failed its Run with
    "the key must name at least one column", exit 1, as if a retry could help."""
    admin.execute(f'CREATE TABLE "{schema}".t ()')
    admin.execute(f'INSERT INTO "{schema}".t DEFAULT VALUES')
    with pytest.raises(ConfigError) as caught:
        source.preflight([make_request("t", key=())])
    assert (
        caught.value.message
        == f"dataset 't': {schema}.t has no columns, so no row of it can be told from another"
    )
    assert caught.value.hint == f"add a column to {schema}.t, or remove the dataset"
