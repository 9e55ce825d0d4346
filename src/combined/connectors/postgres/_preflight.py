"""What a PostgreSQL read cannot take, found from the catalog before any row is read."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import pyarrow as pa

from combined.connectors._shared import unreadable_column_fix
from combined.connectors.postgres._types import JSON, JSONPATH, XML, ColumnPlan
from combined.errors import ConfigError


def _interval(t: pa.DataType | None) -> bool:
    if t is None:
        return False
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _interval(t.value_type)
    return bool(pa.types.is_interval(t))


def _unreadable(p: ColumnPlan) -> str | None:
    """Why column ``p`` cannot be read as itself (the words after its type), or None."""
    if p.route == "unsupported":
        return f": {p.reason}"
    if _interval(p.arrow_type):
        # month_day_nano_interval has no canonical identity encoding: no row holding
        # it could be identified or hashed.
        return (
            ", which Combined cannot read as itself (its Arrow type, "
            f"{p.arrow_type}, has no canonical identity encoding)"
        )
    return None


def refuse_unreadable(
    dataset: str,
    relation: str,
    chosen: Sequence[ColumnPlan],
    cdc: bool,
    unlisted: Collection[str] = (),
) -> None:
    """Refuse a read selecting columns it cannot take as themselves, naming every one.

    An ``interval`` read as itself, and a type without an Arrow type (a
    range, a composite): the read refused them only once the Run had
    started (for ``cdc`` after the publication and the slot were created),
    and this refusal named one column at a time, so a table of ten took ten
    rounds of check and edit. The hint fixes them all at once: the casts of
    every one, or the ``columns:`` list without them (``unlisted``: columns
    that list must not name, a cdc dataset's generated ones).
    """
    refused = [(p, why) for p in chosen if (why := _unreadable(p)) is not None]
    if not refused:
        return
    kept = [p.name for p in chosen if _unreadable(p) is None and p.name not in unlisted]
    names = [p.name for p, _ in refused]
    if len(refused) == 1:
        p, why = refused[0]
        told = f"column {p.name!r} of {relation!r} has type {p.source_type}{why}"
    else:
        each = "; ".join(f"{p.name!r} has type {p.source_type}{why}" for p, why in refused)
        told = f"{len(refused)} columns of {relation!r} cannot be read as themselves: {each}"
    raise ConfigError(
        f"dataset {dataset!r}: {told}",
        hint=unreadable_column_fix(relation, names, cdc=cdc, kept=kept),
        dataset=dataset,
        column=names[0],
        columns=names,
        source_type=refused[0][0].source_type,
    )


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


#: Types PostgreSQL has no ordering for (no default btree operator class):
#: ``ORDER BY`` over them fails on the server.
_UNORDERED = frozenset({JSON, XML, JSONPATH})


def refuse_order(dataset: str, by_name: Mapping[str, ColumnPlan], order: Sequence[str]) -> None:
    """Refuse a page order over a column that cannot be compared (nested, interval).

    A ``json``, ``xml`` or ``jsonpath`` key (or a domain over one) passed
    ``combined check``, and every cursor read then failed on the server
    ("could not identify an ordering operator for type json"), a Run
    ``failed`` as if a retry could help. Pages order the relation's own
    columns, so a cast to text does not help either.
    """
    for name in order:
        plan = by_name[name]
        kind = plan.arrow_type
        unordered = plan.base_oid in _UNORDERED and not plan.is_list
        if unordered or kind is None or pa.types.is_nested(kind) or pa.types.is_interval(kind):
            raise ConfigError(
                f"dataset {dataset!r}: key column {name!r} ({plan.source_type}) cannot order pages",
                hint="declare a key of numbers, text, dates, timestamps, uuids or bytes",
                dataset=dataset,
                column=name,
            )


#: Relation kinds a logical replication slot cannot stream, by ``relkind``.
_UNSTREAMED = {"v": "a view", "m": "a materialized view", "f": "a foreign table"}


def refuse_unstreamed(
    dataset: str,
    relation: str,
    kind: str,
    persistence: str,
    identity: str,
    keyed: bool,
    identity_fix: Callable[[str], str],
) -> None:
    """Refuse a ``cdc`` dataset whose relation's changes no slot would carry.

    ``combined check`` passed a view, an UNLOGGED table and a table of
    ``REPLICA IDENTITY NOTHING``; the capture then failed with "table not
    found", the server's bare "cannot add relation to publication", or a
    hint to add the primary key the table had. ``kind``, ``persistence``
    and ``identity`` are the relation's ``relkind``, ``relpersistence`` and
    ``relreplident``; ``keyed``: whether an index can serve as its identity;
    ``identity_fix``: the hint giving it one, given what to say when no index
    can (:func:`._identity.identity_hint`).
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
        fix = identity_fix("add a primary key")
    else:
        return
    raise ConfigError(f"cdc dataset {dataset!r}: {relation} {why}", hint=fix, dataset=dataset)


def refuse_wal_level(level: str | None, datasets: Sequence[str] = ()) -> None:
    """Refuse change capture from a server whose ``wal_level`` is not ``logical``.

    No retry helps (the setting takes a restart of the server), so it is
    refused before a Run, naming the ``cdc`` datasets that need it, as
    ``combined check`` tells it.
    """
    refusal = wal_level_refusal(level, datasets)
    if refusal is not None:
        raise refusal


def wal_level_refusal(level: str | None, datasets: Sequence[str] = ()) -> ConfigError | None:
    """What :func:`refuse_wal_level` raises of ``level``; None for ``logical``."""
    if level == "logical":
        return None
    named = ", ".join(repr(d) for d in datasets)
    which = f"dataset{'s' if len(datasets) > 1 else ''} {named}: " if datasets else ""
    return ConfigError(
        f"{which}change capture (strategy: cdc) needs wal_level=logical, the server has "
        f"{level or '?'}",
        hint="have a superuser run ALTER SYSTEM SET wal_level = logical and restart the server "
        "(a managed service sets it among its parameters); or capture the dataset with "
        "strategy: snapshot or cursor",
    )
