"""The lake's rows compared over the capture's columns, where the lake holds columns it lacks.

A column the source dropped (``drift.drop: evolve``), or one a dataset's
``columns:`` left out since, stays in the lake with its former values. It
is no change of a row's data: a re-capture compares each lake row with the
captured one over the columns the capture holds (``_kcmp``), so a row that
did not otherwise change is left as it is, its former value kept, and is
not billed. A row that changed is written whole, without the column (null
in the lake from then on).

A change stream may read a column's drop after changes that still held
it (one backlog: an update, then ``DROP COLUMN``, then more changes): the
capture's rows then hold the column, null in every change read after the
drop. Those columns (``gone``, the drift's evolved drops) are compared
around too, and a captured row is unchanged when its hash is the lake
row's over the other columns or its stored one (a change before the drop
that left the row as the lake holds it). A change before the drop that
only set the column to null is then no change either: the lake keeps the
former value, as a snapshot re-read after the drop would.

The stored payload hash (docs/identity.md) stays the lake's contract: a
lake row whose dropped columns are all null already has the hash of the
capture's columns (a null member is left out of the payload text), and it
is compared as stored; only the others are hashed again, from the lake's
values, for this comparison alone. The transition's old hashes (the
content digest) stay the stored ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from combined.protocol import _provenance as prov
from combined.protocol._digest import Digest
from combined.protocol.identity import payload_hash_sql, quote_ident

#: The column of ``cur`` a captured row's payload hash is compared with.
COMPARED = "_kcmp"


def dropped_columns(
    lake: pa.Schema | None, payload: Sequence[str], gone: Sequence[str] = ()
) -> list[str]:
    """The lake's source columns the capture's ``payload`` does not hold, or holds only as
    changes read before the source dropped them (``gone``), in the lake's order."""
    if lake is None:
        return []
    held = set(payload) - set(gone)
    return [n for n in lake.names if n not in held and not n.startswith("_combined_")]


def compared(payload: Sequence[str], dropped: Sequence[str]) -> list[str]:
    """The capture's ``payload`` columns a lake row is compared over: all but ``dropped``."""
    left_out = set(dropped)
    return [n for n in payload if n not in left_out]


def unchanged_sql(captured: str, current: str, kcmp: str) -> str:
    """Whether a captured row's hash ``captured`` is the lake row's (``current``: its
    alias, with a dot, or empty): over the capture's columns, or as stored."""
    if kcmp == "_khash":
        return f"{captured} = {current}_khash"
    return f"({captured} = {current}{kcmp} OR {captured} = {current}_khash)"


def current_sql(
    files: str,
    current_filter: str | None,
    *,
    lake: pa.Schema,
    capture: pa.Schema,
    payload: Sequence[str],
    dropped: Sequence[str],
    digest: Digest,
) -> str:
    """The SELECT of ``cur`` (``_kid``, ``_khash``, ``_kcmp``) over the lake's files ``files``.

    ``_kcmp``: the stored hash where every dropped column is null, else the
    hash of the lake's values of the capture's ``payload`` columns (in the
    capture's types where the lake stores a type as its text: a time of
    day, JSON). A value whose identity text the lake's type does not keep
    (an interval stored as text) hashes otherwise: its row counts as
    changed, as it would have before this comparison.
    """
    values, types = [], []
    for name in payload:
        q = quote_ident(name)
        staged = capture.field(name).type
        if name not in lake.names:
            values.append(f"NULL AS {q}")  # (a column this capture added: null in the lake)
            types.append(pa.field(name, pa.null()))
            continue
        held = lake.field(name).type
        expr, hashed = _read_back(q, staged, held)
        values.append(f"{expr} AS {q}")
        types.append(pa.field(name, hashed))
    kept = payload_hash_sql(list(payload), pa.schema(types), digest)
    all_null = " AND ".join(f"{quote_ident(n)} IS NULL" for n in dropped)
    inner = ", ".join([prov.ID, prov.PAYLOAD_HASH, *(quote_ident(n) for n in dropped), *values])
    where = f" WHERE {current_filter}" if current_filter else ""
    return (
        f"SELECT {prov.ID} AS _kid, {prov.PAYLOAD_HASH} AS _khash, "
        f"CASE WHEN {all_null} THEN {prov.PAYLOAD_HASH} ELSE {kept} END AS {COMPARED} "
        f"FROM (SELECT {inner} FROM read_parquet({files}, union_by_name = true){where})"
    )


def _read_back(q: str, staged: pa.DataType, held: pa.DataType) -> tuple[str, pa.DataType]:
    """The SQL of a lake column ``q`` (stored as ``held``) and the type it is hashed as:
    the lake's own, but a time of day or JSON the lake holds as its text."""
    if pa.types.is_time(staged) and pa.types.is_string(held):
        return f"CAST({q} AS TIME)", staged
    if (
        pa.types.is_list(staged)
        and pa.types.is_time(staged.value_type)
        and pa.types.is_list(held)
        and pa.types.is_string(held.value_type)
    ):
        return f"CAST({q} AS TIME[])", staged
    json = isinstance(staged, pa.BaseExtensionType) and staged.extension_name == "arrow.json"
    if json and pa.types.is_string(held):
        return q, staged  # (the JSON text as stored)
    return q, held
