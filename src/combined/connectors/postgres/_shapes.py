"""A relation message's columns as the assembler compares them (:mod:`._assemble`).

Their types as a checkpoint records them and a relation message shows them
(a key column's type changed is refused), whether two relations build the
same batch, and a partition's row change put in its table's column order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from combined.connectors.postgres._pgoutput import Delete, Relation, RowChange, TupleData, Update
from combined.connectors.postgres._rewrite import REKEY_HINT
from combined.errors import NeedsSnapshot

__all__ = ["as_table_row", "check_key_types", "recorded_types", "same_columns", "types_of"]


def same_columns(a: Relation, b: Relation) -> bool:
    """Whether two relations' rows build the same batch (names, types, modifiers)."""
    return [(c.name, c.type_oid, c.type_modifier) for c in a.columns] == [
        (c.name, c.type_oid, c.type_modifier) for c in b.columns
    ]


def _reorder(row: TupleData, positions: tuple[int, ...]) -> TupleData:
    return TupleData(
        "".join(row.kinds[i] for i in positions), tuple(row.values[i] for i in positions)
    )


def as_table_row(change: RowChange, oid: int, positions: tuple[int, ...] | None) -> None:
    """Make a partition's row change the partitioned table's (its oid, its column order).

    Changes the decoded message in place: it is made for this one use.
    """
    change.relation_oid = oid
    if positions is None:
        return
    if isinstance(change, Delete):
        change.old = _reorder(change.old, positions)
        return
    change.new = _reorder(change.new, positions)
    if isinstance(change, Update) and change.old is not None:
        change.old = _reorder(change.old, positions)


#: Key types whose values keep their identity texts across a change within the group.
_KEY_FAMILIES = ({20, 21, 23}, {25, 1043})


def types_of(msg: Relation) -> dict[str, tuple[int, int]]:
    """Each column of ``msg`` with its (type oid, type modifier)."""
    return {c.name: (c.type_oid, c.type_modifier) for c in msg.columns}


def check_key_types(
    relation: str,
    dataset: str,
    key: set[str],
    was: Mapping[str, tuple[int, int]],
    shown: Mapping[str, tuple[int, int]],
) -> None:
    """Refuse a key column whose type changed other than an integer or text widening.

    ``timestamp`` to ``timestamptz``, a decimal's scale, a text made a
    number: each row's identity changed without a change in the stream, and
    the lake's rows can no longer be matched (an update lands as a new row).
    """
    for name, now in shown.items():
        old = was.get(name)
        if name not in key or old is None or old == now:
            continue
        if any(old[0] in f and now[0] in f for f in _KEY_FAMILIES):
            continue
        raise NeedsSnapshot(
            f"key column {name!r} of {relation} changed type (oid {old[0]} to "
            f"{now[0]}): its rows' identities changed with no change in the stream",
            hint=REKEY_HINT,
            dataset=dataset,
        )


def recorded_types(state: Mapping[str, Any] | None) -> dict[str, tuple[int, int]] | None:
    """The column types a checkpoint recorded (``types``), if it did."""
    types = (state or {}).get("types")
    if not isinstance(types, Mapping):
        return None
    return {str(n): (int(pair[0]), int(pair[1])) for n, pair in types.items()}
