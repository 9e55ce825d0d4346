"""The tables a captured relation's rows live in: its partitions and inheritance children.

A ``SELECT`` from a partitioned table or from an inheritance parent returns
the rows of every table below it, so the snapshot of such a relation holds
them all. Its change stream is another matter:

* A partitioned table has no rows of its own. With ``publish_via_partition_root``
  off (what :func:`~combined.connectors.postgres._publication.ensure_publication`
  sets), pgoutput sends each change under the partition (the leaf) that
  holds the row, and a ``TRUNCATE`` of one partition as that partition's:
  the stream routes leaves to the partitioned table's dataset. A partition
  created by ``CREATE TABLE ... PARTITION OF`` streams from its creation
  on. But attaching a table brings rows no change ever carried, and
  detaching or dropping a partition removes rows without a delete: neither
  is in the stream, so both fail the capture (only a new snapshot closes
  the gap).
* An inheritance parent's stream carries only its own rows' changes, never
  its children's (they publish under their own oids, and a child created
  later is not even published). Its change capture is refused: read it with
  the snapshot or cursor strategy, or capture each child with ``cdc``.

:class:`Tree` is what the catalog says about those tables now; the
checkpoint of a partitioned table's change capture records its links
(:meth:`Tree.record`), and :func:`check_links` compares a later tree with it.
A link is one ``pg_inherits`` row, known by the child's oid and the
transaction that made it (``xmin``): a partition detached and attached again
is a new link.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from combined.connectors.postgres._catalog import relation_name
from combined.connectors.postgres._replication import RECOVER_HINT
from combined.errors import NeedsSnapshot, SourceError

__all__ = ["Link", "Rows", "Tree", "check_links", "check_publishable", "precedes", "read_tree"]

#: Runs one query and returns its rows (an ADBC session's or a psycopg connection's).
Rows = Callable[[sql.Composed], Sequence[Sequence[Any]]]

_ROOT = sql.SQL(
    "SELECT c.oid::bigint, c.relkind::text,"
    " ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid"
    "   AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum)"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = {} AND c.relname = {}"
)

# Every pg_inherits row below the root (depth-bounded against a cycle), with
# what decides whether a new one is harmless: whether the child's table came
# from the same transaction as the link, i.e. CREATE TABLE ... PARTITION OF.
# The child's creation is told by the pg_depend row tying its row type to it,
# written with the table and never updated; the pg_type row itself is
# rewritten by ALTER TABLE ... RENAME, OWNER TO and SET SCHEMA.
_LINKS = sql.SQL(
    "WITH RECURSIVE links(child, parent, link_xmin, link_cmin, depth) AS ("
    " SELECT i.inhrelid, i.inhparent, i.xmin::text::bigint, i.cmin::text::bigint, 1"
    "  FROM pg_inherits i WHERE i.inhparent = {root}"
    " UNION ALL"
    " SELECT i.inhrelid, i.inhparent, i.xmin::text::bigint, i.cmin::text::bigint, l.depth + 1"
    "  FROM pg_inherits i JOIN links l ON i.inhparent = l.child WHERE l.depth < 64)"
    " SELECT l.child::bigint, l.parent::bigint, l.link_xmin, l.link_cmin, n.nspname::text,"
    " c.relname::text, c.relkind::text,"
    " COALESCE((SELECT d.xmin::text::bigint = l.link_xmin FROM pg_depend d"
    "   WHERE d.classid = 'pg_type'::regclass AND d.objid = c.reltype"
    "   AND d.refclassid = 'pg_class'::regclass AND d.refobjid = c.oid AND d.deptype = 'i'"
    "   LIMIT 1), false),"
    " c.relreplident = 'f' OR (c.relreplident IN ('d', 'i') AND EXISTS ("
    "   SELECT FROM pg_index x WHERE x.indrelid = c.oid"
    "   AND CASE c.relreplident WHEN 'd' THEN x.indisprimary ELSE x.indisreplident END))"
    " FROM links l JOIN pg_class c ON c.oid = l.child"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " ORDER BY 1"
)


@dataclass(frozen=True, slots=True)
class Link:
    """One table below the captured relation (a ``pg_inherits`` row)."""

    child: int
    parent: int
    #: The transaction that made the link, and its command in it.
    xmin: int
    cmin: int
    #: The child's schema, name and ``relkind``.
    schema: str
    table: str
    kind: str
    #: Whether the child table was created by the transaction that linked it.
    made_with_table: bool
    #: Whether the child has a replica identity (its updates and deletes can be published).
    identity: bool

    @property
    def name(self) -> str:
        """The child as ``schema.table``."""
        return relation_name(self.schema, self.table)


@dataclass(frozen=True, slots=True)
class Tree:
    """A relation and every table below it (``links`` is empty for a plain table)."""

    oid: int
    name: str
    kind: str
    #: The relation's column names, in attribute order.
    columns: tuple[str, ...]
    links: tuple[Link, ...]

    @property
    def partitioned(self) -> bool:
        """Whether the relation is a partitioned table."""
        return self.kind == "p"

    @property
    def leaves(self) -> frozenset[int]:
        """The oids of the tables below it that hold rows (not themselves partitioned)."""
        return frozenset(link.child for link in self.links if link.kind != "p")

    def record(self) -> list[list[int]]:
        """The links as a checkpoint holds them: ``[child oid, link xmin]``, sorted."""
        return [[c, x] for c, x in sorted({(link.child, link.xmin) for link in self.links})]

    def link(self, child: int) -> Link | None:
        """The link of ``child``, if it is below the relation."""
        return next((link for link in self.links if link.child == child), None)


def read_tree(rows: Rows, schema: str, table: str) -> Tree | None:
    """The relation ``schema.table`` and the tables below it; None when it does not exist."""
    found = rows(_ROOT.format(sql.Literal(schema), sql.Literal(table)))
    if not found:
        return None
    oid, kind, columns = found[0]
    links = tuple(
        Link(
            int(child),
            int(parent),
            int(xmin),
            int(cmin),
            str(nspname),
            str(relname),
            str(relkind),
            bool(made),
            bool(identity),
        )
        for child, parent, xmin, cmin, nspname, relname, relkind, made, identity in rows(
            _LINKS.format(root=sql.Literal(int(oid)))
        )
    )
    return Tree(int(oid), relation_name(schema, table), str(kind), tuple(columns or ()), links)


def check_publishable(tree: Tree) -> None:
    """Refuse the change capture of a relation whose stream would not carry all its rows.

    An inheritance parent (children's changes never reach its stream), a
    partitioned table with a foreign-table partition (logical replication
    carries no foreign table's changes) or with a partition that has no
    replica identity (once published, the server refuses that partition's
    updates and deletes: the application would fail).
    """
    if not tree.partitioned:
        _refuse_children(tree, None)
        return
    for link in tree.links:
        if link.kind == "f":
            raise SourceError(
                f"partition {link.name} of {tree.name} is a foreign table, whose changes "
                "logical replication does not carry",
                hint=f"capture {tree.name} with strategy snapshot or cursor",
                relation=tree.name,
            )
        if link.kind == "r" and not link.identity:
            raise SourceError(
                f"partition {link.name} of {tree.name} has no replica identity: once "
                "published, the server would refuse its updates and deletes",
                hint=f"add a primary key to {tree.name} (its partitions get it), "
                f"or ALTER TABLE {link.name} REPLICA IDENTITY FULL",
                relation=tree.name,
            )


def _refuse_children(tree: Tree, when: str | None) -> None:
    """Refuse a table with inheritance children; ``when`` they appeared, if after setup."""
    children = [link.name for link in tree.links if link.parent == tree.oid]
    if not children:
        return
    shown = ", ".join(children[:5]) + (
        f" and {len(children) - 5} more" if len(children) > 5 else ""
    )
    what = "has inheritance children" if when is None else f"gained inheritance children {when}"
    raise SourceError(
        f"table {tree.name} {what} ({shown}): its change stream "
        "carries only its own rows' changes, while a read of it returns theirs too",
        hint=f"capture {tree.name} with strategy snapshot or cursor, "
        "or each child table as a cdc dataset of its own",
        relation=tree.name,
    )


def check_links(
    rows: Rows,
    tree: Tree,
    before: Sequence[Sequence[int]] | None,
    *,
    when: str,
    streamed: Iterable[int] = (),
) -> None:
    """Raise unless every row below ``tree`` is in the stream since ``before`` was recorded.

    ``before`` is the checkpoint's :meth:`Tree.record`; ``when`` says since
    when, for the message ("since the last capture"); ``streamed`` are the
    partitions the stream sent changes of, which must still be there. A
    link that is gone (a partition detached or dropped) fails, and so does
    a new one unless its table was created by the transaction that linked it
    and holds no row that transaction wrote before linking it.

    The rows are told by ``xmin`` and ``cmin``: a row written inside a
    savepoint carries the subtransaction's xid, which the catalog cannot tie
    to its transaction, so a table created, filled in a savepoint and
    attached in one transaction escapes this check.
    """
    if not tree.partitioned:
        _refuse_children(tree, when)
        return
    if before is None:
        raise NeedsSnapshot(
            f"the checkpoint of partitioned table {tree.name} does not record its partitions",
            hint=RECOVER_HINT,
            relation=tree.name,
        )
    old = {(int(c), int(x)) for c, x in before}
    now = {(link.child, link.xmin): link for link in tree.links}
    _refuse_gone(rows, tree, sorted(old - now.keys()), when)
    _refuse_unstreamed(rows, tree, streamed, when)
    added = {link.child: link for key, link in now.items() if key not in old}
    for link in added.values():
        _check_added(rows, tree, link, added, when)


def _refuse_gone(rows: Rows, tree: Tree, gone: list[tuple[int, int]], when: str) -> None:
    """Raise if a link the checkpoint recorded is gone (detached, dropped or re-attached)."""
    if not gone:
        return
    child = gone[0][0]
    again = tree.link(child)
    what = (
        f"partition {again.name} was detached from {tree.name} and attached again"
        if again is not None
        else f"partition {_describe(rows, child)} was detached from or dropped out of {tree.name}"
    )
    raise NeedsSnapshot(
        f"{what} {when}: its rows left the table without a change in the stream, "
        "so the lake still holds them",
        hint=RECOVER_HINT,
        relation=tree.name,
    )


def _refuse_unstreamed(rows: Rows, tree: Tree, streamed: Iterable[int], when: str) -> None:
    """Raise if a partition the stream sent changes of is no longer below ``tree``."""
    leaves = tree.leaves
    for oid in streamed:
        if oid not in leaves:
            raise NeedsSnapshot(
                f"partition {_describe(rows, oid)} was detached from or dropped out of "
                f"{tree.name} {when}: its rows left the table without a change in the stream",
                hint=RECOVER_HINT,
                relation=tree.name,
            )


def _check_added(rows: Rows, tree: Tree, link: Link, added: dict[int, Link], when: str) -> None:
    """Raise unless the new ``link`` (and those above it) brought no row the stream missed."""
    if link.kind == "p":
        return  # a partitioned partition holds no rows: its leaves are judged
    if link.kind == "f":
        raise NeedsSnapshot(
            f"partition {link.name} of {tree.name}, attached {when}, is a foreign table, "
            "whose changes logical replication does not carry",
            hint=f"{RECOVER_HINT}, or capture {tree.name} with strategy snapshot or cursor",
            relation=tree.name,
        )
    # The new links from this leaf up to the first one the checkpoint knew.
    node: Link | None = link
    while node is not None and node.child in added:
        if not node.made_with_table or _rows_before_link(rows, link, node):
            raise NeedsSnapshot(
                f"partition {node.name} was attached to {tree.name} {when}: the rows "
                "it held then were never in the change stream",
                hint=f"{RECOVER_HINT}; create partitions with CREATE TABLE ... PARTITION OF "
                "so that their rows stream from the start",
                relation=tree.name,
            )
        node = tree.link(node.parent)


def _rows_before_link(rows: Rows, leaf: Link, step: Link) -> bool:
    """Whether ``leaf`` holds a row written by ``step``'s transaction before ``step`` linked it."""
    found = rows(
        sql.SQL(
            "SELECT EXISTS (SELECT FROM ONLY {} WHERE xmin = CAST({} AS xid)"
            " AND CAST(CAST(cmin AS text) AS bigint) < {})"
        ).format(
            sql.Identifier(leaf.schema, leaf.table),
            sql.Literal(str(step.xmin)),
            sql.Literal(step.cmin),
        )
    )
    return bool(found and found[0][0])


def _describe(rows: Rows, oid: int) -> str:
    found = rows(
        sql.SQL(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = {}"
        ).format(sql.Literal(oid))
    )
    return relation_name(*found[0]) if found else f"(oid {oid}, since dropped)"


def precedes(a: int, b: int) -> bool:
    """Whether 32-bit transaction id ``a`` was assigned before ``b`` (modulo wraparound)."""
    return a != b and ((a - b) & 0xFFFFFFFF) >= 0x80000000
