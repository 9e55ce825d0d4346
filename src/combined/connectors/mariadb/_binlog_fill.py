"""Values of columns an ``ALTER TABLE`` gave the rows present, which the binlog never logs.

``ALTER TABLE ... ADD COLUMN`` with a non-NULL ``DEFAULT``, as ``NOT NULL``
(its implicit default), ``AUTO_INCREMENT``/``SERIAL`` or as a generated
column gives every row present a value and logs no row event for them:
only rows changed afterwards carry it. At such a statement the read takes
the key and the new columns of every row from the source
(:class:`ColumnFill`), in a consistent snapshot read as the first capture
reads (:class:`~._extract.MariaDBExtraction`), and puts each row in the
stream as an update of those columns alone: every other column is named in
``_combined_unchanged``, and the engine fills it from the row's earlier
change in the capture, else from the lake (``capture._unchanged``), as it
does for PostgreSQL.

The snapshot is later than the statement, at the binlog position ``T``
pinned to it (:attr:`ColumnFill.at`). The read goes on at least to ``T``
before it ends: a row changed between the statement and ``T`` has that
change after its filled value, and the last change wins; a row the snapshot
does not hold was deleted meanwhile, and its delete follows; a row inserted
meanwhile is filled before its insert, which lands in the same commit.

A column an ``ALTER TABLE`` redefines (``MODIFY``, ``CHANGE``) is filled the
same way: the table's copy may have cut, rounded or clamped its values, or
turned its NULLs into a NOT NULL type's default, without a row event. So is
a column renamed (``RENAME COLUMN a TO b``): the rows present hold their
values under the new name without a row event, and the lake's column of that
name (another's, when two columns swapped names) held other values. And so
is a column added under a name an earlier ``ALTER`` of the log dropped or
renamed away, or that the lake holds (``renewed``): it is a new column, with
the value its definition gives each row (NULL without a default), while the
lake held the dropped column's values under that name.

A column can also appear with no ``ALTER`` in the log at all: a column
grant widened (the catalog hides a column the account may not read, and the
binlog, which carries every column, was read without it), or a name the
dataset's ``columns:`` gained. A captured column the catalog shows at a
read's start that the lake lacks, or that the checkpoint did not record
(:func:`appeared_columns`), is filled the same way where the read would
end (at the log's end, or where ``max_changes`` stops it), unless an
``ALTER`` the read met added it (that statement's own fill, if any, holds):
the snapshot is later than every change read before, and the read goes on
to its position as above. As PostgreSQL does (``postgres._fill``,
``relations_now``): the catalog at the run's start, filled at its end.

:meth:`ColumnFill.count_nulls` counts the filled columns' nulls in one
snapshot, with its binlog position, for reconciliation.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa

from combined.connectors.abc import ReadRequest
from combined.connectors.mariadb import _catalog as catalog
from combined.connectors.mariadb._binlog_anchor import TableLock, pins_snapshots
from combined.connectors.mariadb._binlog_setup import RESNAPSHOT
from combined.connectors.mariadb._connect import Session, Settings, quote_ident
from combined.errors import NeedsSnapshot, SourceError
from combined.protocol import RecordBatchMessage

__all__ = ["Added", "ColumnFill", "added_columns", "appeared_columns", "clauses", "left_columns"]

#: An ALTER TABLE clause adding a column (not an index, key, constraint or partition).
_ADD_COLUMN = re.compile(
    r"\badd\s+(?:column\s+)?(?:if\s+not\s+exists\s+)?(?!(?:index|key|constraint|primary|"
    r"unique|foreign|fulltext|spatial|check|partition|period|system)\b)",
    re.IGNORECASE,
)
#: What gives the rows an added column finds a value without a row event.
_FILLED = re.compile(
    # (``DEFAULT(5)`` and ``DEFAULT'x'`` need no space; ``DEFAULT (NULL)`` gives none)
    r"\bdefault\b(?!\s*\(?\s*null\b)|\bnot\s+null\b|\bas\s*\(|\bauto_increment\b|\bserial\b",
    re.IGNORECASE,
)
_NAME = re.compile(r"\s*(`(?:[^`]|``)+`|[\w$]+)")
#: An ALTER TABLE clause redefining a column (``CHANGE`` names the old column first,
#: ``RENAME COLUMN old TO new`` too).
_MODIFY = re.compile(
    r"\b(modify|change|rename\s+column)\s+(?:column\s+)?(?:if\s+exists\s+)?", re.IGNORECASE
)
_TO = re.compile(r"\s+to\b", re.IGNORECASE)
#: An ALTER TABLE clause dropping a column (without ``COLUMN``: not an index, key,
#: constraint, partition or default).
_DROP_COLUMN = re.compile(
    r"\bdrop\s+(?:column\s+(?:if\s+exists\s+)?|(?:if\s+exists\s+)?(?!(?:index|key|"
    r"constraint|primary|foreign|check|partition|period|system|default)\b))",
    re.IGNORECASE,
)


def clauses(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses and quotes."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    return [*out, text[start:]]


def _bare(clause: str) -> str:
    """``clause`` with its string literals emptied: no words inside them."""
    return re.sub(r"'(?:[^'\\]|\\.|'')*'", "''", clause)


@dataclass(frozen=True, slots=True)
class Added:
    """The columns an ALTER TABLE adds, and those it gives the rows present a value in."""

    names: tuple[str, ...]
    filled: tuple[str, ...]
    #: The first clause giving a value, as written (for messages).
    clause: str
    #: Columns redefined (``MODIFY``/``CHANGE``/``RENAME COLUMN``): the server may have rewritten
    #: their values (a type that rounds or cuts them) without a row event.
    rewritten: tuple[str, ...] = ()
    #: Columns added under a name that named another column (dropped or renamed away):
    #: the lake holds that one's values under it, the rows present the new one's.
    renewed: tuple[str, ...] = ()
    #: Columns that appeared with no ``ALTER`` (:func:`appeared_columns`), not added by one.
    appeared: bool = False

    @property
    def fills(self) -> bool:
        """Whether the rows present took a value in a column without a row event."""
        return bool(self.filled or self.rewritten or self.renewed)


def _definitions(bare: str, after: int) -> list[str]:
    """The column definitions one ADD clause holds (``ADD (a INT, b INT)`` holds two)."""
    rest = bare[after:].strip()
    if rest.startswith("("):
        return clauses(rest[1 : rest.rfind(")")])
    return [rest]


def added_columns(alter: str, former: Collection[str] = ()) -> Added:
    """What an ALTER TABLE adds; whether it gives the rows present values (:attr:`Added.fills`).

    MariaDB gives every row present a column added with a default, as ``NOT
    NULL`` (its implicit default) or as a generated column, and logs no row
    event for it: those rows must be filled. So must a column added under a
    name in ``former`` (the names of columns dropped or renamed away, or the
    lake holds): whatever it gives them, the lake holds another column's
    values under that name.
    """
    names: list[str] = []
    filled: list[str] = []
    rewritten: list[str] = []
    renewed: list[str] = []
    first = ""
    for clause in clauses(alter):
        bare = _bare(clause)
        add = _ADD_COLUMN.search(bare)
        if add is None:
            rewritten += _redefined(bare)
            continue
        for definition in _definitions(bare, add.end()):
            name = _NAME.match(definition)
            if name is None:
                continue
            column = name.group(1).strip("`").replace("``", "`")
            names.append(column)
            if _FILLED.search(definition, name.end()):
                filled.append(column)
            elif column in former:
                renewed.append(column)
            else:
                continue
            first = first or " ".join(clause[add.start() :].split())[:120]
    return Added(tuple(names + rewritten), tuple(filled), first, tuple(rewritten), tuple(renewed))


def left_columns(alter: str) -> list[str]:
    """The names an ALTER TABLE takes away from the table's columns, in its clauses' order:
    a column dropped, or renamed (``CHANGE old new``, ``RENAME COLUMN old TO new``)."""
    out: list[str] = []
    for clause in clauses(alter):
        bare = _bare(clause)
        found = _DROP_COLUMN.search(bare) or _MODIFY.search(bare)
        if found is None or found.group(0).lower().startswith("modify"):
            continue
        name = _NAME.match(bare, found.end())
        if name is not None:
            out.append(name.group(1).strip("`").replace("``", "`"))
    return out


def _redefined(bare: str) -> list[str]:
    """The column a ``MODIFY`` or ``CHANGE`` clause leaves (none for another clause)."""
    found = _MODIFY.search(bare)
    if found is None:
        return []
    name = _NAME.match(bare, found.end())
    verb = found.group(1).lower()
    if name is not None and verb == "change":
        name = _NAME.match(bare, name.end())
    elif name is not None and verb != "modify":  # RENAME COLUMN old TO new
        to = _TO.match(bare, name.end())
        name = None if to is None else _NAME.match(bare, to.end())
    return [] if name is None else [name.group(1).strip("`").replace("``", "`")]


def appeared_columns(request: ReadRequest, names: Iterable[str]) -> Added | None:
    """The columns a read fills where it ends, unless an ALTER it meets adds them: of
    ``names`` (the captured columns the catalog shows at its start), those the lake
    lacks, or the checkpoint's columns do not hold.

    None where the lake's columns are not known, or for an event stream (its events
    happened before the column was there: not filled, as in PostgreSQL).
    """
    lake = request.options.get("lake_columns")
    if lake is None or request.options.get("event_stream"):
        return None
    recorded = (request.state or {}).get("columns") or {}
    new = tuple(n for n in names if n not in lake or (recorded and n not in recorded))
    if not new:
        return None
    return Added(new, new, "shown by the catalog when the read started", appeared=True)


#: Key types a redefinition keeps identities in (an integer widened: INT to BIGINT).
_INTEGERS = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint"})


def _refuse(relation: str, added: Added, why: str, hint: str) -> NeedsSnapshot:
    what = (
        "shows a column the lake lacks with no ALTER TABLE in the binlog (a column grant "
        "widened, or a name the dataset's `columns:` gained), whose values the rows present "
        "hold without a change in the binlog"
        if added.appeared
        else "was altered since the last capture with a column the rows present took a value "
        "in without a change in the binlog"
    )
    return NeedsSnapshot(f"table {relation} {what}, and {why}", hint=hint)


def _keyless_now(relation: str, key: Sequence[str]) -> SourceError:
    """No key to match a filled row by, at this moment: a capture later may find it again."""
    named = ", ".join(key)
    return SourceError(
        f"table {relation} holds no PRIMARY KEY now, nor a UNIQUE index over NOT NULL "
        f"columns on the dataset's key ({named}), and a column it gained must be filled by "
        "that key. A migration that drops the primary key to add it again leaves "
        "the table so for a moment: nothing was committed, and the next capture tries again",
        hint=f"if the key is gone for good, add a PRIMARY KEY or a UNIQUE index over NOT NULL "
        f"columns on ({named}), or take a new snapshot: {RESNAPSHOT}",
    )


class ColumnFill:
    """Read the key and some columns of every row in one consistent snapshot.

    :attr:`at` is the binlog position pinned to the last snapshot read
    (``None`` before any): the read must go on at least that far.
    """

    def __init__(self, settings: Settings, request: ReadRequest) -> None:
        self._settings = settings
        self._request = request
        self.at: tuple[str, int] | None = None

    def check(self, relation: str, added: Added) -> list[str]:
        """The captured columns of ``added`` to fill; refuse a fill that cannot hold.

        A column gone again by now has no values to read; a key other than
        the table's primary key or a unique key over NOT NULL columns cannot
        match a row read to its lake row.
        """
        session = Session(self._settings)
        try:
            db, table = catalog.parse_relation(relation, self._settings.database)
            cols = catalog.columns(session, db, [table]).get(table, [])
            idx = catalog.indexes(session, db, [table]).get(table, [])
        finally:
            session.close()
        chosen = self._request.columns
        wanted = [c for c in added.filled if chosen is None or c in chosen]
        present = {c.name for c in cols}
        gone = [c for c in wanted if c not in present]
        # A column redefined or renewed, then dropped again, holds no values to fix.
        again = (*added.rewritten, *added.renewed)
        wanted += [c for c in again if c in present and (chosen is None or c in chosen)]
        if gone:
            raise _refuse(
                relation,
                added,
                f"column {gone[0]!r} ({added.clause!r}) is no longer in the table to read "
                "its values from",
                f"take a new snapshot: {RESNAPSHOT}",
            )
        key = set(self._request.key)
        moved = [c.name for c in cols if c.name in key and c.name in added.rewritten]
        if any(c.data_type.lower() not in _INTEGERS for c in cols if c.name in moved):
            # A key redefined other than as an integer (a shorter VARCHAR, a DATETIME's
            # precision, a number made text) may hold other values, or other identities:
            # its rows would land beside the old ones, which would stay.
            raise _refuse(
                relation,
                added,
                f"key column {moved[0]!r} was redefined ({added.clause!r}): its rows' "
                "identities may have changed, and the lake's rows could not be matched",
                f"take a new snapshot: {RESNAPSHOT}",
            )
        primary, uniques = catalog.keys(idx, catalog.column_plans(cols, table=table))
        if wanted and not any(set(k) == key for k in (primary, *uniques) if k):
            if not primary:
                raise _keyless_now(relation, self._request.key)
            raise _refuse(
                relation,
                added,
                f"the dataset's key ({', '.join(self._request.key)}) is not a PRIMARY KEY or "
                "UNIQUE index over NOT NULL columns, so a row read cannot be matched to its "
                "lake row",
                f"key the dataset on the table's primary key, then take a new snapshot: "
                f"{RESNAPSHOT}",
            )
        return wanted

    def __call__(self, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        """The key and ``columns`` of every row, in one consistent snapshot (sets :attr:`at`)."""
        from combined.connectors.mariadb._binlog_stitch import pinned
        from combined.connectors.mariadb._extract import MariaDBExtraction
        from combined.connectors.mariadb._read_plan import ReadOptions

        s, req = self._settings, self._request
        snap = replace(
            req,
            strategy="snapshot",
            state=None,
            cursor=None,
            columns=tuple(dict.fromkeys((*req.key, *columns))),
            options={},
        )
        inner = MariaDBExtraction(s, snap, ReadOptions.of(snap, s))
        if not pins_snapshots(s):
            inner.anchor = TableLock(s, req.relation)
        done = False
        try:
            for msg in inner:  # (the read that asked holds the cdc refusals' wording)
                if isinstance(msg, RecordBatchMessage):
                    yield msg.batch
            done = True
        finally:
            inner.finish("success" if done else "abort")
        position, _ = pinned(inner.snapshot_pin, snap)
        name, _, offset = position.rpartition(":")
        at = (name, int(offset))
        self.at = at if self.at is None else max(self.at, at)

    def count_nulls(self, columns: Sequence[str]) -> tuple[dict[str, int], tuple[str, int]] | None:
        """Nulls of each of ``columns`` in one consistent snapshot, and its binlog position.

        ``None`` where the server pins no position to a snapshot (MySQL): the
        count could not be tied to the transactions the lake holds.
        """
        from combined.connectors.mariadb._extract import BEGIN

        s = self._settings
        if not pins_snapshots(s):
            return None
        db, table = catalog.parse_relation(self._request.relation, s.database)
        counts = ", ".join(f"COALESCE(SUM({quote_ident(c)} IS NULL), 0)" for c in columns)
        session = Session(s)
        try:
            for statement in BEGIN:
                session.run(statement, "opening a snapshot to count the filled columns")
            pin = dict(session.rows("SHOW STATUS LIKE 'binlog_snapshot_%'", "reading the pin"))
            ((*nulls,),) = session.rows(
                f"SELECT {counts} FROM {quote_ident(db)}.{quote_ident(table)}",
                f"counting the nulls of the filled columns of {db}.{table}",
            )
            session.run("COMMIT", "closing the snapshot")
        finally:
            session.close()
        at = (str(pin["Binlog_snapshot_file"]), int(pin["Binlog_snapshot_position"]))
        return {c: int(n) for c, n in zip(columns, nulls, strict=True)}, at
