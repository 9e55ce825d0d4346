"""What a PostgreSQL read cannot take, found from the catalog before any row is read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from combined.connectors._shared import unreadable_column_fix
from combined.connectors.postgres._types import ColumnPlan
from combined.errors import ConfigError


def _interval(t: pa.DataType | None) -> bool:
    if t is None:
        return False
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _interval(t.value_type)
    return bool(pa.types.is_interval(t))


def refuse_intervals(dataset: str, relation: str, plans: Sequence[ColumnPlan], cdc: bool) -> None:
    """Refuse a read selecting an ``interval`` column read as itself.

    Its Arrow type (month_day_nano_interval) has no canonical identity
    encoding, so no row holding it could be identified or hashed: the
    capture failed after reading, as if retrying could help.
    """
    for p in plans:
        if _interval(p.arrow_type):
            why = (
                ", which Combined cannot read as itself (its Arrow type, "
                f"{p.arrow_type}, has no canonical identity encoding)"
            )
            _refuse(dataset, relation, p, cdc, why, cast_does="")


def refuse_unsupported(dataset: str, relation: str, plans: Sequence[ColumnPlan], cdc: bool) -> None:
    """Refuse a read selecting a column whose type has no Arrow type (a range, a composite).

    The read refused it only once the Run had started: a needs_review Run
    that `combined check` had passed, and for ``cdc`` after the publication
    and the replication slot were created, left on the server retaining WAL.
    """
    for p in plans:
        if p.route == "unsupported":
            _refuse(dataset, relation, p, cdc, f": {p.reason}", cast_does=" to read its text form")


def refuse_cursor(dataset: str, by_name: Mapping[str, ColumnPlan], column: str) -> ColumnPlan:
    """The cursor column's plan; refused unless it is a number, date or timestamp.

    ``combined check`` passed a text or time cursor that every capture then
    refused: a Run ``failed`` as if a retry could help.
    """
    plan = by_name[column]
    if not (plan.orderable_number or plan.temporal):
        raise ConfigError(
            f"dataset {dataset!r}: column {column!r} ({plan.source_type}) cannot serve as a cursor",
            hint="choose a number, date or timestamp column; see discovery's candidates",
            dataset=dataset,
            column=column,
        )
    return plan


def refuse_order(dataset: str, by_name: Mapping[str, ColumnPlan], order: Sequence[str]) -> None:
    """Refuse a page order over a column that cannot be compared (nested, interval)."""
    for name in order:
        kind = by_name[name].arrow_type
        if kind is None or pa.types.is_nested(kind) or pa.types.is_interval(kind):
            raise ConfigError(
                f"dataset {dataset!r}: key column {name!r} ({by_name[name].source_type}) "
                "cannot order pages",
                hint="declare a key of numbers, text, dates, timestamps, uuids or bytes",
                dataset=dataset,
                column=name,
            )


def _refuse(
    dataset: str, relation: str, p: ColumnPlan, cdc: bool, why: str, *, cast_does: str
) -> None:
    """Raise the refusal of column ``p`` (``why`` after its type), with the fix that applies."""
    fix = unreadable_column_fix(relation, p.name, cdc=cdc, cast_does=cast_does)
    raise ConfigError(
        f"dataset {dataset!r}: column {p.name!r} of {relation!r} has type {p.source_type}{why}",
        hint=fix,
        dataset=dataset,
        column=p.name,
        source_type=p.source_type,
    )


#: Relation kinds a logical replication slot cannot stream, by ``relkind``.
_UNSTREAMED = {"v": "a view", "m": "a materialized view", "f": "a foreign table"}


def refuse_unstreamed(
    dataset: str, relation: str, kind: str, persistence: str, identity: str, keyed: bool
) -> None:
    """Refuse a ``cdc`` dataset whose relation's changes no slot would carry.

    ``combined check`` passed a view, an UNLOGGED table and a table of
    ``REPLICA IDENTITY NOTHING``; the capture then failed with "table not
    found", the server's bare "cannot add relation to publication", or a
    hint to add the primary key the table had. ``kind``, ``persistence``
    and ``identity`` are the relation's ``relkind``, ``relpersistence`` and
    ``relreplident``; ``keyed``: whether an index can serve as its identity.
    """
    snapshot = f"or capture {relation} with strategy: snapshot (or cursor)"
    if kind in _UNSTREAMED:
        why = f"is {_UNSTREAMED[kind]}, whose changes logical replication does not stream"
        fix = f"capture the tables it reads with strategy: cdc, {snapshot}"
    elif persistence != "p":
        why = "is UNLOGGED (or temporary): its changes are not written to the WAL"
        fix = f"ALTER TABLE {relation} SET LOGGED, {snapshot}"
    elif identity == "n" or (identity in ("d", "i") and not keyed):
        why = (
            "has REPLICA IDENTITY NOTHING: its updates and deletes could not be published"
            if identity == "n"
            else "has no replica identity (no primary key): its updates and deletes could "
            "not be published"
        )
        fix = (
            f"ALTER TABLE {relation} REPLICA IDENTITY DEFAULT (its primary key) or FULL"
            if identity == "n"
            else f"add a primary key, or ALTER TABLE {relation} REPLICA IDENTITY FULL"
        )
    else:
        return
    raise ConfigError(f"cdc dataset {dataset!r}: {relation} {why}", hint=fix, dataset=dataset)
