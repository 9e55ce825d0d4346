"""Values rewritten in place with no change in the stream, as the catalog tells them.

Logical decoding streams row changes only. Besides a column's type (see
:mod:`._fill`), two things the catalog holds change what rows read as
without one:

* ``ALTER TYPE ... RENAME VALUE`` gives an enum label another text. A row
  stores the label's ``pg_enum`` oid, so every row holding it reads the
  new text from then on. :attr:`Marks.labels` records, for each column of
  an enum type (an array of one, a domain over either), each label's oid
  and text in sort order: a recorded oid whose text changed was renamed,
  and the column is read again. ``ADD VALUE`` makes a new oid and changes
  no row: nothing is read. (Comparing oids, not texts, also tells a label
  renamed and its old text added again as a new label.)
* A statement that writes the table anew writes it to a new file
  (``pg_class.relfilenode``): ``ALTER COLUMN ... TYPE`` to the same type
  with ``USING`` (``int`` to ``int USING v * 10``), but also ``VACUUM
  FULL``, ``CLUSTER``, ``TRUNCATE``, ``SET TABLESPACE``. :attr:`Marks.files`
  records the file of each table that holds the rows (the table, or each
  leaf partition); another file has every column but the key read again.
  A rewrite that changed no value costs that read alone: its rows are found
  unchanged, neither updated nor billed.

Each checkpoint records both (:meth:`Marks.record`); each run reads them when
it starts, with the table's columns (:func:`._fill.relations_now`), and reads
again at its end what differs (:meth:`._assemble._Assembler.fill_late`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from combined.connectors.postgres._tree import Rows
from combined.errors import NeedsSnapshot

__all__ = ["REKEY_HINT", "Marks", "read_marks", "recorded_marks", "to_read_again"]

#: The way out of a key whose identities changed with no change in the stream.
REKEY_HINT = (
    "run `combined cdc teardown` then `combined cdc setup` for the source: a new snapshot "
    "keys the rows by their new values"
)

#: Each streamed column whose type is an enum, an array of one or a domain over
#: either (followed down, bounded against a cycle), with its enum's labels'
#: ``pg_enum`` oids and texts, in the enum's sort order.
_LABELS = sql.SQL(
    "WITH RECURSIVE col(attnum, attname, typ, depth) AS ("
    " SELECT a.attnum, a.attname::text, a.atttypid, 0 FROM pg_attribute a"
    "  WHERE a.attrelid = {oid} AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''"
    " UNION ALL"
    " SELECT c.attnum, c.attname, CASE y.typtype WHEN 'd' THEN y.typbasetype ELSE y.typelem END,"
    "  c.depth + 1 FROM col c JOIN pg_type y ON y.oid = c.typ WHERE c.depth < 16"
    "  AND (y.typtype = 'd' OR (y.typcategory = 'A' AND y.typelem <> 0)))"
    " SELECT c.attname, e.oid::bigint, e.enumlabel::text FROM col c"
    " JOIN pg_enum e ON e.enumtypid = c.typ ORDER BY c.attnum, e.enumsortorder"
)

#: The file of each table below the relation, itself included, that holds rows.
_FILES = sql.SQL(
    "WITH RECURSIVE tree(oid, depth) AS (SELECT CAST({oid} AS oid), 0"
    " UNION ALL SELECT i.inhrelid, t.depth + 1 FROM pg_inherits i"
    "  JOIN tree t ON i.inhparent = t.oid WHERE t.depth < 64)"
    " SELECT c.oid::bigint, c.relfilenode::bigint FROM tree t JOIN pg_class c ON c.oid = t.oid"
    " WHERE c.relkind = 'r' ORDER BY 1"
)


@dataclass(frozen=True, slots=True)
class Marks:
    """What the catalog says of a table's values beyond its columns' types."""

    #: Per column of an enum type: each label's ``pg_enum`` oid and text, in sort order.
    labels: Mapping[str, tuple[tuple[int, str], ...]]
    #: The ``relfilenode`` of each table holding rows (the table, or each leaf), by oid.
    files: Mapping[int, int]

    def record(self) -> dict[str, Any]:
        """The marks as a checkpoint holds them (``labels`` and ``files``)."""
        return {
            "labels": {c: [[oid, text] for oid, text in ls] for c, ls in self.labels.items()},
            "files": [[oid, node] for oid, node in sorted(self.files.items())],
        }


def recorded_marks(state: Mapping[str, Any] | None) -> Marks | None:
    """The marks a checkpoint recorded, if it did (one written before they were did not)."""
    labels, files = (state or {}).get("labels"), (state or {}).get("files")
    if not isinstance(labels, Mapping) or not isinstance(files, list):
        return None
    return Marks(
        {str(c): tuple((int(oid), str(text)) for oid, text in ls) for c, ls in labels.items()},
        {int(oid): int(node) for oid, node in files},
    )


def read_marks(rows: Rows, oid: int) -> Marks:
    """The marks of relation ``oid`` as the catalog holds them (in ``rows``' snapshot)."""
    labels: dict[str, list[tuple[int, str]]] = {}
    for column, label, text in rows(_LABELS.format(oid=sql.Literal(oid))):
        labels.setdefault(str(column), []).append((int(label), str(text)))
    files = {int(o): int(node) for o, node in rows(_FILES.format(oid=sql.Literal(oid)))}
    return Marks({c: tuple(ls) for c, ls in labels.items()}, files)


def to_read_again(
    was: Marks,
    now: Marks,
    columns: Sequence[str],
    key: Collection[str],
    *,
    relation: str,
    dataset: str,
) -> list[str]:
    """Which of ``columns`` to read again, their values rewritten since ``was``.

    Every column but the ``key`` when a table's file changed; else the
    columns whose enum had a label renamed. A key column's renamed label
    changed its rows' identities, which a read by key cannot mend:
    :class:`NeedsSnapshot`.
    """
    if any(now.files.get(oid, node) != node for oid, node in was.files.items()):
        return [c for c in columns if c not in key]
    renamed = [c for c in columns if _renamed(was.labels.get(c, ()), now.labels.get(c))]
    named = [c for c in renamed if c in key]
    if named:
        raise NeedsSnapshot(
            f"a label of the enum of key column {named[0]!r} of {relation} was renamed "
            "(ALTER TYPE ... RENAME VALUE): its rows' identities changed with no change "
            "in the stream",
            hint=REKEY_HINT,
            dataset=dataset,
        )
    return renamed


def _renamed(was: Sequence[tuple[int, str]], now: Sequence[tuple[int, str]] | None) -> bool:
    """Whether a label the column had (``was``) has another text ``now``, or is gone (the
    column took another enum: its type's fill reads it too). A label added is neither;
    ``now`` None: the column is no enum any more (its type's fill reads it)."""
    if now is None:
        return False
    texts = dict(now)
    return any(texts.get(oid) != text for oid, text in was)
