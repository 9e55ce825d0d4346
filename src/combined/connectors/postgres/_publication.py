"""Publications of the captured tables: created, verified, dropped.

Each cdc dataset's publication carries the slot's name and publishes its one
table. A partitioned table is published partition by partition
(``publish_via_partition_root`` off): pgoutput then sends a ``TRUNCATE`` of
one of its partitions, which it drops when it publishes through the root,
and :mod:`~combined.connectors.postgres._tree` decides what the stream of
such a table can carry. Connections and the classification of refused
statements are :mod:`~combined.connectors.postgres._replication`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from combined.connectors.postgres._catalog import parse_relation, relation_name
from combined.connectors.postgres._connect import Settings
from combined.connectors.postgres._identity import identity_hint
from combined.connectors.postgres._replication import (
    RECOVER_HINT,
    _check_wal_level,
    _control,
)
from combined.connectors.postgres._slot_owner import Claim, refuse_unowned, settle, stamp
from combined.connectors.postgres._tree import (
    Rows,
    Tree,
    check_links,
    check_publishable,
    read_tree,
)
from combined.errors import ConfigError, NeedsSnapshot, NotFoundError, SourceError, StreamGap

__all__ = [
    "Publication",
    "drop_publication",
    "ensure_publication",
    "partition_ancestors",
    "read_table_tree",
    "require_owned",
    "require_published",
    "verify_tree",
]


@dataclass(frozen=True, slots=True)
class Publication:
    """A publication that covers the captured tables.

    ``slot``: the slot of its name as the claim judged it (``_slot_owner.settle``),
    for ``drop_slot(judged=...)``; None when there was none, or no claim.
    """

    name: str
    tables: tuple[str, ...]
    created: bool
    slot: str | None = None


#: What to do when the role may not create or alter the publication.
_PUBLICATION_HINT = (
    "creating a publication takes CREATE on the database and ownership of its tables "
    "(or a superuser): have such a role run CREATE PUBLICATION for the tables, or grant "
    "them; setup then verifies the existing publication instead of creating it"
)


def ensure_publication(
    settings: Settings,
    name: str,
    tables: Sequence[str],
    *,
    add_missing: bool = False,
    claim: Claim | None = None,
) -> Publication:
    """Create publication ``name`` for ``tables`` or verify that it covers them.

    ``tables`` are ``schema.table`` (``public`` when no schema is given).
    Every table needs a replica identity (a primary key, an identity index or
    ``FULL``): without one the server rejects the application's updates and
    deletes once the table is published. A partitioned table is published
    with ``publish_via_partition_root`` off, so that its changes, a
    ``TRUNCATE`` of one partition included, come under each partition's
    own oid (see :mod:`~combined.connectors.postgres._tree`); each of its
    partitions then needs a replica identity. An inheritance parent is
    refused (its stream lacks its children's changes). An existing
    publication must publish inserts, updates, deletes and truncates, and
    publish the tables whole (no row filter, no column list); tables
    it lacks are added, and a partitioned table's publication switched off
    ``publish_via_partition_root``, only with ``add_missing`` (a table added
    to a live slot has no snapshot: rerun setup to take one).

    With a ``claim``, another project's publication (or one whose slot is not
    provably the claimant's) is refused first, and the publication marked the
    claimant's (:mod:`~combined.connectors.postgres._slot_owner`): all in one
    transaction, so a publication is never made without its mark, nor left
    behind by a refusal.
    """
    wanted = tuple(dict.fromkeys(relation_name(*parse_relation(t)) for t in tables))
    if not wanted:
        raise ConfigError("a publication needs at least one table", hint="declare a cdc dataset")
    with (
        _control(settings, "set up the publication", denied_hint=_PUBLICATION_HINT) as conn,
        conn.transaction(),
    ):
        _check_wal_level(conn)
        trees = [_check_publishable(conn, table) for table in wanted]
        partitioned = any(tree.partitioned for tree in trees)
        judged = None if claim is None else settle(conn, name, claim)
        row = conn.execute(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot "
            "FROM pg_publication WHERE pubname = %s",
            (name,),
        ).fetchone()
        if row is None:
            _create_publication(conn, name, wanted, partitioned)
            if claim is not None and claim.owner is not None:
                stamp(conn, name, claim.owner)
            return Publication(name, wanted, created=True, slot=judged)
        all_tables, *actions, via_root = row
        if not all(actions):
            raise SourceError(
                f"publication {name!r} does not publish every kind of change",
                hint=f"ALTER PUBLICATION {name} SET (publish = 'insert, update, delete, truncate')",
            )
        if partitioned and via_root:
            if not add_missing:
                raise SourceError(_VIA_ROOT.format(name=name), hint=_via_root_hint(name))
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = false)").format(
                    sql.Identifier(name)
                )
            )
        if not all_tables:
            _add_missing_tables(conn, name, wanted, add_missing)
        for table in wanted:
            narrowed = _narrowed(conn, name, table)
            if narrowed:  # (a first capture's Run: needs_review, as at every later one)
                raise NeedsSnapshot(narrowed, hint=_narrowed_hint(name, table), publication=name)
        return Publication(name, wanted, created=False, slot=judged)


def _create_publication(
    conn: psycopg.Connection[Any], name: str, wanted: tuple[str, ...], partitioned: bool
) -> None:
    """CREATE PUBLICATION for ``wanted`` (partitions' changes under their own oids)."""
    idents = sql.SQL(", ").join(sql.Identifier(*parse_relation(t)) for t in wanted)
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}{}").format(
            sql.Identifier(name),
            idents,
            sql.SQL(" WITH (publish_via_partition_root = false)") if partitioned else sql.SQL(""),
        )
    )


def _add_missing_tables(
    conn: psycopg.Connection[Any], name: str, wanted: tuple[str, ...], add_missing: bool
) -> None:
    """Add the ``wanted`` tables publication ``name`` lacks; refuse unless ``add_missing``."""
    have = _published_tables(conn, name)
    missing = [t for t in wanted if parse_relation(t) not in have]
    if missing and not add_missing:
        raise SourceError(
            f"publication {name!r} does not cover {', '.join(missing)}",
            hint=f"ALTER PUBLICATION {name} ADD TABLE {', '.join(missing)}; "
            "then rerun cdc setup so the added tables get a snapshot",
        )
    if missing:
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                sql.Identifier(name),
                sql.SQL(", ").join(sql.Identifier(*parse_relation(t)) for t in missing),
            )
        )


#: A publication that sends a partitioned table's changes under the root's oid.
_VIA_ROOT = (
    "publication {name!r} publishes partitioned tables through their root "
    "(publish_via_partition_root): a TRUNCATE of one partition is then not streamed"
)


def _via_root_hint(name: str) -> str:
    return f"ALTER PUBLICATION {name} SET (publish_via_partition_root = false)"


def _narrowed(conn: psycopg.Connection[Any], name: str, table: str) -> str | None:
    """What narrows publication ``name``'s stream of ``table``: a row filter, a column list.

    From PostgreSQL 15 a publication may publish a table's rows matching a
    ``WHERE`` only (a row updated out of it then comes as a delete, one
    updated into it as an insert, and the changes of the others never) or
    its listed columns only. Either is read on the table, its partitions
    and the tables it is a partition of. None when neither is set (always
    before 15: ``prqual`` and ``prattrs`` do not exist there).
    """
    if conn.info.server_version < 150000:
        return None
    rows = conn.execute(
        "WITH t AS (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s) "
        "SELECT n.nspname::text, c.relname::text, r.prqual IS NOT NULL, r.prattrs IS NOT NULL "
        "FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
        "JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace, t "
        "WHERE p.pubname = %s AND (r.prqual IS NOT NULL OR r.prattrs IS NOT NULL) "
        "AND r.prrelid IN (SELECT t.oid UNION SELECT relid FROM pg_partition_tree(t.oid) "
        "UNION SELECT relid FROM pg_partition_ancestors(t.oid)) ORDER BY 1, 2",
        (*parse_relation(table), name),
    ).fetchall()
    if not rows:
        return None
    what = " and ".join(
        f"{relation_name(schema, rel)} with "
        + " and ".join(
            kind for kind, on in (("a row filter (WHERE)", qual), ("a column list", cols)) if on
        )
        for schema, rel, qual, cols in rows
    )
    return (
        f"publication {name!r} publishes {what}: the changes of rows outside a row filter are "
        "not streamed (a row updated out of it comes as a delete), nor the columns outside "
        "a column list"
    )


def _narrowed_hint(name: str, table: str) -> str:
    return (
        f"publish the whole table: ALTER PUBLICATION {name} SET TABLE {table} (naming every "
        "table it publishes, none with a WHERE or a column list); or DROP PUBLICATION "
        f"{name} and let cdc setup create its own"
    )


def _published_tables(conn: psycopg.Connection[Any], name: str) -> set[tuple[str, str]]:
    """(schema, table) of every table publication ``name`` names or streams.

    ``pg_publication_tables`` lists a partitioned table's partitions (with
    ``publish_via_partition_root`` off), not the table itself: the tables
    the publication names are in ``pg_publication_rel``. Pairs, not
    ``schema.table`` text: a name holding a dot or a quote is quoted in the
    configuration's text, and a table the publication had was added again.
    """
    return {
        (s, t)
        for s, t in conn.execute(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables "
            "WHERE pubname = %s UNION SELECT n.nspname::text, c.relname::text "
            "FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
            "JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE p.pubname = %s",
            (name, name),
        )
    }


def _rows_of(conn: psycopg.Connection[Any]) -> Rows:
    def rows(query: sql.Composed) -> list[tuple[Any, ...]]:
        return conn.execute(query).fetchall()

    return rows


def read_table_tree(settings: Settings, table: str) -> Tree | None:
    """``table`` (``schema.table``) and the tables below it, now; None when it does not exist."""
    with _control(settings, "read the captured table's partitions") as conn:
        return read_tree(_rows_of(conn), *parse_relation(table))


def verify_tree(
    settings: Settings,
    table: str,
    before: Sequence[Sequence[int]] | None,
    *,
    when: str,
    streamed: Iterable[int] = (),
) -> Tree | None:
    """The table's tree now, once :func:`~._tree.check_links` found it in step with ``before``."""
    with _control(settings, "read the captured table's partitions") as conn:
        tree = read_tree(_rows_of(conn), *parse_relation(table))
        if tree is not None:
            check_links(_rows_of(conn), tree, before, when=when, streamed=streamed)
        return tree


def partition_ancestors(settings: Settings, oid: int) -> tuple[int, ...]:
    """The partitioned tables above relation ``oid`` (empty when it is no partition)."""
    with _control(settings, "read a partition's ancestors") as conn:
        return tuple(
            int(r[0])
            for r in conn.execute(
                "SELECT relid::bigint FROM pg_partition_ancestors(%s::oid) WHERE relid <> %s::oid",
                (oid, oid),
            )
        )


def _check_publishable(conn: psycopg.Connection[Any], table: str) -> Tree:
    tree = read_tree(_rows_of(conn), *parse_relation(table))
    if tree is None or tree.kind not in ("r", "p"):
        raise NotFoundError(f"table {table!r} not found", hint="check the dataset's relation")
    row = conn.execute(
        "SELECT c.relreplident, EXISTS (SELECT 1 FROM pg_index i "
        "WHERE i.indrelid = c.oid AND (i.indisprimary OR i.indisreplident)) "
        "FROM pg_class c WHERE c.oid = %s",
        (tree.oid,),
    ).fetchone()
    assert row is not None
    identity, has_index = row
    if identity == "n" or (identity in ("d", "i") and not has_index):
        raise SourceError(
            f"table {table!r} has no replica identity",
            hint=identity_hint(_rows_of(conn), *parse_relation(table), (), "add a primary key"),
        )
    check_publishable(tree)
    return tree


def require_published(settings: Settings, name: str, table: str) -> None:
    """Raise :class:`StreamGap` unless publication ``name`` still publishes ``table``.

    The slot streams only the tables its publication covers: a table dropped
    (and perhaps created again), or taken out of the publication, sends no
    further change, and a stream read past that point would lose its rows'
    changes without a word. Only a new snapshot closes that gap. A
    partitioned table must still be published partition by partition
    (``publish_via_partition_root`` off), or truncates of its partitions
    are lost. A row filter or a column list (PostgreSQL 15+) loses the
    changes outside it. Mending any of these does not bring the changes back
    (the WAL of that time is decoded as the publication was then): the
    engine records the refusal until a new snapshot (``runtime._gap``).
    """
    schema, relation = parse_relation(table)
    with _control(settings, "read the publication") as conn:
        row = conn.execute(
            "SELECT pubinsert AND pubupdate AND pubdelete AND pubtruncate, pubviaroot, "
            "EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'p') "
            "FROM pg_publication p WHERE p.pubname = %s",
            (schema, relation, name),
        ).fetchone()
        covered = row is not None and (schema, relation) in _published_tables(conn, name)
        narrowed = _narrowed(conn, name, table) if covered else None
    if row is None:
        raise StreamGap(
            f"publication {name!r} of the captured table {table!r} does not exist: "
            "the slot streams none of its changes",
            hint=RECOVER_HINT,
            publication=name,
        )
    every_kind, via_root, partitioned = row
    if not covered:
        raise StreamGap(
            f"publication {name!r} no longer publishes {table!r} (the table was dropped, "
            "renamed or removed from the publication): changes since then were not streamed",
            hint=RECOVER_HINT,
            publication=name,
        )
    if not every_kind:
        raise StreamGap(
            f"publication {name!r} no longer publishes every kind of change of {table!r}",
            hint=f"ALTER PUBLICATION {name} SET (publish = 'insert, update, delete, truncate'), "
            f"then {RECOVER_HINT}",
            publication=name,
        )
    if via_root and partitioned:
        raise StreamGap(
            _VIA_ROOT.format(name=name),
            hint=f"{_via_root_hint(name)}, then {RECOVER_HINT}",
            publication=name,
        )
    if narrowed is not None:
        raise StreamGap(
            f"{narrowed}: changes may have been lost while it was set, and removing it does "
            "not bring them back: only a new snapshot does",
            hint=f"{_narrowed_hint(name, table)}; then {RECOVER_HINT}",
            publication=name,
        )


def require_owned(settings: Settings, name: str, claim: Claim) -> str | None:
    """Raise unless slot and publication ``name`` are provably ``claim``'s, or absent
    (``_slot_owner.judge``); ahead of dropping them. Returns the slot as judged
    (``_slot_owner.settle``)."""
    with _control(settings, "read the publication") as conn:
        return refuse_unowned(conn, name, claim)


def drop_publication(settings: Settings, name: str) -> bool:
    """Drop publication ``name``; return whether it existed."""
    with _control(
        settings,
        "drop the publication",
        denied_hint="drop the publication as its owner or a superuser",
    ) as conn:
        row = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
        if row is None:
            return False
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
        return True
