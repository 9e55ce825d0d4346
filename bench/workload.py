"""The benchmark's data: a dedicated database with an ``orders`` table, and its changes.

Everything is deterministic (no randomness): the same ``--rows`` gives the
same bytes, so runs on different days compare.

``orders``: ``id bigint`` primary key, ``customer_id int``, ``status text``,
``total numeric(12,2)``, ``note text`` (10% NULL), ``created_at`` and
``updated_at timestamptz`` (an index on ``updated_at`` serves dlt's
incremental cursor).

The change applied before the "changed" cases (:func:`mutate`): 1% of the
rows updated (``id % 100 = 50``; ``updated_at`` bumped), 0.1% deleted
(``id % 1000 = 7``), 0.5% inserted above the largest id. :func:`append` adds
1% more rows above the largest id for the cursor case.

Other table shapes (``--shape``, :data:`SHAPES`) take the same changes:
``narrow`` (``id bigint``, ``n int``, ``label text``, ``updated_at
timestamptz``: the per-row costs, 5M rows at full size) and ``wide``
(``numeric(14,4)``, ``text[]`` with NULL elements, ``jsonb``, ``uuid``,
``date``, ``timestamptz`` and a ``body text`` stored out of line, 2-4 KB in
5% of the rows: the type costs, 1M rows at full size). Their updates leave
``body`` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

DEFAULT_SERVER_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_DATABASE = "combined_bench"
TABLE = "orders"

UPDATE_MOD, UPDATE_REM = 100, 50  # 1%
DELETE_MOD, DELETE_REM = 1000, 7  # 0.1% (disjoint from the updated rows)
INSERT_FRACTION = 0.005
APPEND_FRACTION = 0.01


def database_dsn(server_dsn: str, database: str) -> str:
    """The libpq connection string of ``database`` on the server of ``server_dsn``."""
    return make_conninfo(server_dsn, dbname=database)


def sqlalchemy_url(dsn: str, driver: str = "postgresql+psycopg2") -> str:
    """A SQLAlchemy URL for a libpq DSN (dlt's ``sql_table`` wants one)."""
    parts = conninfo_to_dict(dsn)
    user = quote(str(parts.get("user", "postgres")), safe="")
    password = parts.get("password")
    auth = f"{user}:{quote(str(password), safe='')}" if password else user
    host = parts.get("host", "127.0.0.1")
    port = parts.get("port", "5432")
    return f"{driver}://{auth}@{host}:{port}/{parts.get('dbname', 'postgres')}"


def reset_database(server_dsn: str, database: str) -> str:
    """Drop and create ``database``; return its DSN."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return database_dsn(server_dsn, database)


def drop_database(server_dsn: str, database: str) -> None:
    """Drop ``database`` if it exists."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )


_ROWS = """
INSERT INTO {t}
SELECT g,
       ((g * 7919) % 100000)::int,
       (ARRAY['new', 'paid', 'shipped', 'delivered', 'returned'])[1 + (g % 5)::int],
       round((((g * 37) % 100000) / 100.0 + 1)::numeric, 2),
       CASE WHEN g % 10 = 0 THEN NULL ELSE 'order ' || g || ' ' || md5(g::text) END,
       timestamptz '2020-01-01 00:00:00+00' + g * interval '1 second',
       timestamptz '2020-01-01 00:00:00+00' + g * interval '1 second'
FROM generate_series({lo}::bigint, {hi}::bigint) AS g
"""


_NARROW_ROWS = """
INSERT INTO {t}
SELECT g, ((g * 7919) % 100000)::int, 'item ' || (g % 1000),
       timestamptz '2020-01-01 00:00:00+00' + g * interval '1 second'
FROM generate_series({lo}::bigint, {hi}::bigint) AS g
"""

_WIDE_ROWS = """
INSERT INTO {t}
SELECT g,
       round((((g * 37) % 10000000) / 10000.0 + 1)::numeric, 4),
       CASE WHEN g % 7 = 0 THEN NULL
            ELSE ARRAY['t' || (g % 13), NULL, 'tag-' || (g % 101)] END,
       jsonb_build_object('k', g % 97, 'name', 'n' || g, 'ok', g % 2 = 0,
                          'xs', jsonb_build_array(g % 5, 1.5, NULL)),
       md5(g::text)::uuid,
       date '2020-01-01' + (g % 3650)::int,
       timestamptz '2020-01-01 00:00:00+00' + g * interval '1 second',
       CASE WHEN g % 20 = 3 THEN repeat(md5(g::text), (64 + g % 64)::int) END
FROM generate_series({lo}::bigint, {hi}::bigint) AS g
"""


@dataclass(frozen=True)
class Shape:
    """A benchmark table: its columns, its rows, the update of its changed rows."""

    name: str
    table: str
    rows: int  # at full size
    columns: str
    fill: str
    update: str  # the SET list of an updated row (bumps updated_at)
    external: tuple[str, ...] = ()  # columns stored out of line, uncompressed
    key: tuple[str, ...] = ("id",)  # the dataset's key
    index: bool = True  # an index on updated_at (dlt's cursor)
    partitions: int = 0  # hash partitions by id (0: a plain table)


SHAPES: dict[str, Shape] = {
    "orders": Shape(
        "orders",
        TABLE,
        2_000_000,
        "id bigint PRIMARY KEY, customer_id integer NOT NULL, status text NOT NULL, "
        "total numeric(12,2) NOT NULL, note text, created_at timestamptz NOT NULL, "
        "updated_at timestamptz NOT NULL",
        _ROWS,
        "status = 'updated', total = total + 1, updated_at = now()",
    ),
    "narrow": Shape(
        "narrow",
        "narrow",
        5_000_000,
        "id bigint PRIMARY KEY, n integer NOT NULL, label text NOT NULL, "
        "updated_at timestamptz NOT NULL",
        _NARROW_ROWS,
        "label = 'updated', updated_at = now()",
    ),
    "wide": Shape(
        "wide",
        "wide",
        1_000_000,
        "id bigint PRIMARY KEY, amount numeric(14,4) NOT NULL, tags text[], attrs jsonb, "
        "ref uuid NOT NULL, day date NOT NULL, updated_at timestamptz NOT NULL, body text",
        _WIDE_ROWS,
        "amount = amount + 1, updated_at = now()",
        external=("body",),
    ),
}


def create_orders(dsn: str, rows: int, table: str = TABLE, shape: str = "orders") -> None:
    """(Re)create ``table`` of ``shape`` with ``rows`` rows, index, vacuum and analyze it."""
    t = sql.Identifier(table)
    spec = SHAPES[shape]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(t))
        parted = " PARTITION BY HASH (id)" if spec.partitions else ""
        conn.execute(sql.SQL("CREATE TABLE {} (" + spec.columns + ")" + parted).format(t))
        for i in range(spec.partitions):
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} PARTITION OF {} FOR VALUES WITH (MODULUS {}, REMAINDER {})"
                ).format(
                    sql.Identifier(f"{table}_p{i}"), t, sql.Literal(spec.partitions), sql.Literal(i)
                )
            )
        for column in spec.external:  # out of line even when it would compress
            conn.execute(
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STORAGE EXTERNAL").format(
                    t, sql.Identifier(column)
                )
            )
        conn.execute(sql.SQL(spec.fill).format(t=t, lo=sql.Literal(1), hi=sql.Literal(rows)))
        if spec.index:
            conn.execute(
                sql.SQL("CREATE INDEX {} ON {} (updated_at)").format(
                    sql.Identifier(f"{table}_updated_at_idx"), t
                )
            )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(t))


@dataclass(frozen=True)
class Change:
    """What :func:`mutate` or :func:`append` did."""

    updated: int = 0
    deleted: int = 0
    inserted: int = 0

    def as_dict(self) -> dict[str, int]:
        """A JSON-ready copy."""
        return {"updated": self.updated, "deleted": self.deleted, "inserted": self.inserted}


def _insert_above_max(
    conn: psycopg.Connection[tuple[Any, ...]], t: sql.Identifier, n: int, shape: str = "orders"
) -> int:
    if n <= 0:
        return 0
    row = conn.execute(sql.SQL("SELECT coalesce(max(id), 0) FROM {}").format(t)).fetchone()
    top = int(row[0]) if row else 0
    if shape != "orders":  # the shape's own rows, at ids above the largest
        fill = sql.SQL(SHAPES[shape].fill)
        return conn.execute(
            fill.format(t=t, lo=sql.Literal(top + 1), hi=sql.Literal(top + n))
        ).rowcount
    cur = conn.execute(
        sql.SQL(
            "INSERT INTO {t} SELECT g, ((g * 7919) % 100000)::int, 'new', "
            "round((((g * 37) % 100000) / 100.0 + 1)::numeric, 2), 'late order ' || g, "
            "now(), now() FROM generate_series({lo}::bigint, {hi}::bigint) AS g"
        ).format(t=t, lo=sql.Literal(top + 1), hi=sql.Literal(top + n))
    )
    return cur.rowcount


def mutate(dsn: str, rows: int, table: str = TABLE, shape: str = "orders") -> Change:
    """1% updates (bumping ``updated_at``), 0.1% deletes, 0.5% inserts; then vacuum."""
    t = sql.Identifier(table)
    update = sql.SQL("UPDATE {} SET " + SHAPES[shape].update + " WHERE id % {} = {}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            updated = conn.execute(
                update.format(t, sql.Literal(UPDATE_MOD), sql.Literal(UPDATE_REM))
            ).rowcount
            deleted = conn.execute(
                sql.SQL("DELETE FROM {} WHERE id % {} = {}").format(
                    t, sql.Literal(DELETE_MOD), sql.Literal(DELETE_REM)
                )
            ).rowcount
            inserted = _insert_above_max(conn, t, int(rows * INSERT_FRACTION), shape)
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(t))
    return Change(updated=updated, deleted=deleted, inserted=inserted)


def update_all(dsn: str, table: str = TABLE, shape: str = "orders") -> Change:
    """Update every row (the shape's update, bumping ``updated_at``); then vacuum."""
    t = sql.Identifier(table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            update = sql.SQL("UPDATE {} SET " + SHAPES[shape].update).format(t)
            updated = conn.execute(update).rowcount
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(t))
    return Change(updated=updated)


def append(dsn: str, rows: int, table: str = TABLE, shape: str = "orders") -> Change:
    """Append 1% of ``rows`` above the largest id; then vacuum."""
    t = sql.Identifier(table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            inserted = _insert_above_max(conn, t, int(rows * APPEND_FRACTION), shape)
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(t))
    return Change(inserted=inserted)


def count_rows(dsn: str, table: str = TABLE) -> int:
    """``count(*)`` of ``table``."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
        ).fetchone()
    return int(row[0]) if row else 0


def source_ids(dsn: str, table: str = TABLE) -> list[int]:
    """Every id of ``table`` (for checking what a destination kept)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(table))).fetchall()
    return [int(r[0]) for r in rows]


from bench.shapes import CLIFF_SHAPES  # noqa: E402 (they are Shapes: defined above)

SHAPES.update(CLIFF_SHAPES)
