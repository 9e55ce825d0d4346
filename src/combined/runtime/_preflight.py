"""Checks before a Run: what the source shows a dataset cannot take is refused (exit 2).

A configuration problem found only inside a Run ends it ``failed``, which
reads as "retry later", and a retry meets it again. Where the source must be
asked (a column's type, a stream's replication key), the engine asks before
admitting the Run: a connector with a ``preflight(requests)`` method raises
:class:`~combined.errors.ConfigError` for what the datasets cannot take.
Anything else that goes wrong here (an unreachable server, a missing secret)
is left to the Run, which retries or classifies it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from combined.capture._soft import fix_hint, misfit
from combined.config import DeletesConfig, Project, format_duration
from combined.connectors.abc import CursorSpec, DatasetDiscovery, ReadRequest, Source
from combined.errors import (
    AuthRejected,
    CombinedError,
    ConfigError,
    NotFoundError,
    SchemaMismatch,
    SecretError,
)
from combined.runtime._schema_check import check_names


def requests_of(project: Project, source: str, datasets: Sequence[str]) -> list[ReadRequest]:
    """The declared reads of ``datasets`` (no checkpoint: what any read of them asks)."""
    out = []
    for name in datasets:
        d = project.dataset(source, name)
        cursor = d.cursor
        out.append(
            ReadRequest(
                dataset=name,
                relation=d.relation,
                key=tuple(d.key or ()),
                strategy=d.strategy,
                cursor=None
                if cursor is None
                else CursorSpec(cursor.column, cursor.lookback, cursor.trust, cursor.nulls),
                columns=tuple(d.columns) if d.columns else None,
            )
        )
    return out


#: A dataset's committed checkpoint, by source and dataset (``Engine.committed_checkpoint``).
Committed = Callable[[str, str], Mapping[str, Any] | None]


def preflight(
    project: Project,
    source: str,
    datasets: Sequence[str],
    open_source: Callable[[str], Source],
    first: Sequence[str] = (),
    committed: Committed | None = None,
) -> None:
    """Raise :class:`ConfigError` for what ``source`` says its ``datasets`` cannot take.

    ``first``: those of them never captured yet, whose relation, key, cursor and
    ``columns:`` are checked as ``combined check`` does (a misspelt key failed
    the Run, exit 1, "retry later"; later captures keep what the first took).
    ``committed``: the datasets' checkpoints, for a connector's ``cdc_preflight``
    of the ``first`` ones (a slot another project's: :func:`cdc_streams`).
    """
    try:
        conn = open_source(source)
    except SecretError:
        return  # a secret that does not resolve: the Run says so
    check = getattr(conn, "preflight", None)
    try:
        if check is not None:
            check(requests_of(project, source, datasets))
        # (a relation missing is left to the Run, as for a dataset captured before)
        _check_declared(project, source, [d for d in datasets if d in first], conn, missing=True)
        _check_flags(project, source, datasets, conn)
        cdc_preflight = getattr(conn, "cdc_preflight", None)
        if cdc_preflight is not None and committed is not None:
            # (only those never captured: a capture of many streams, or `cdc follow`'s
            # every round, reads no lake table here; a Run judges the others' slots)
            firsts = [d for d in datasets if d in first]
            relations, resumed = cdc_streams(project, source, firsts, committed)
            if relations:
                cdc_preflight(relations, committed=resumed)
    except ConfigError as exc:
        _name_source(source, exc)
        raise
    except CombinedError:
        return  # unreachable, refused: the Run retries or classifies it
    finally:
        conn.close()


def cdc_streams(
    project: Project, source: str, datasets: Sequence[str], committed: Committed
) -> tuple[list[str], dict[str, Mapping[str, Any]]]:
    """The relations of ``datasets``' ``cdc`` ones, and the committed checkpoint of
    each that has one (what a connector's ``cdc_check`` and ``cdc_preflight`` take)."""
    relations: list[str] = []
    resumed: dict[str, Mapping[str, Any]] = {}
    for name in datasets:
        d = project.dataset(source, name)
        if d.strategy == "cdc":
            relations.append(d.relation)
            checkpoint = committed(source, name)
            if checkpoint:
                resumed[d.relation] = checkpoint
    return relations, resumed


def _name_source(source: str, exc: ConfigError) -> None:
    """Name ``source`` in a refusal that does not: a capture of several sources said
    "the postgres database does not exist", and which source's dsn to fix was left
    to guess (``combined check`` prints each source's name before its error)."""
    if not re.search(rf"(?<![\w.]){re.escape(source)}(?![\w])", exc.message):
        exc.args = (f"source {source}: {exc.message}", *exc.args[1:])


# What no cursor can order by, and the numbers a time lookback cannot step.
_UNORDERED = (
    "bool",
    "binary",
    "large_binary",
    "fixed_size_binary",
    "list",
    "large_list",
    "struct",
    "map",
    "null",
    "dictionary",
)
_NUMERIC = ("int", "uint", "float", "double", "halffloat", "decimal")


def verify_declared(project: Project, source: str, open_source: Callable[[str], Source]) -> None:
    """Raise :class:`ConfigError` unless every dataset's relation and columns exist as declared.

    For a connector that describes one relation (``describe_relation``: the
    SQL connectors): each relation exists; its key, cursor and ``columns:``
    name columns it has; the cursor's type can be ordered, and a lookback
    given as a duration steps a date or time, not a number. Then what the
    connector's ``preflight`` refuses. ``combined check`` calls it: a name
    misspelt, or a table dropped since discovery, is told with the dataset's
    name before any capture, and every dataset wrong is told, not the first, with
    what the source's grants refuse its role (``AuthRejected``).
    """
    problems: list[ConfigError | AuthRejected] = []
    conn = open_source(source)
    try:
        check = getattr(conn, "preflight", None)
        for name in project.source(source).datasets:
            try:
                if check is not None:
                    _refused_by(check, requests_of(project, source, [name]))
                _check_declared(project, source, [name], conn)
            except (ConfigError, AuthRejected) as exc:
                problems.append(exc)
    finally:
        conn.close()
    if len(problems) == 1:
        raise problems[0]
    if problems:
        told = "\n".join(
            f"  {p.message}" + (f"\n    hint: {p.hint}" if p.hint else "") for p in problems
        )
        refused = (
            AuthRejected if all(isinstance(p, AuthRejected) for p in problems) else ConfigError
        )
        raise refused(
            f"{len(problems)} datasets of {source} cannot be read as declared:\n{told}",
            hint="fix each in combined.yaml (or at the source), then `combined check` again",
            source=source,
        )


def _refused_by(check: Callable[[list[ReadRequest]], None], requests: list[ReadRequest]) -> None:
    """Raise what a connector's ``preflight`` refuses, its role's grants included; pass what
    else it meets (a relation missing, told by :func:`_check_declared` with its dataset's name)."""
    try:
        check(requests)
    except (ConfigError, AuthRejected):
        raise
    except CombinedError:
        return


def _check_declared(
    project: Project, source: str, datasets: Sequence[str], conn: Source, *, missing: bool = False
) -> None:
    """:func:`verify_declared` of ``datasets`` on an open source (``missing``: a relation
    the source does not have is passed over)."""
    describe = getattr(conn, "describe_relation", None)
    if describe is None:
        return
    for request in requests_of(project, source, datasets):
        where = f"dataset {source}.{request.dataset}"
        try:
            found = describe(request.relation)
        except NotFoundError as exc:
            if missing:
                continue
            close = _closest_relation(conn, request.relation)
            raise ConfigError(
                f"{where} reads {request.relation!r}, which the source does not have: "
                f"{exc.message}",
                hint=(f"did you mean {close!r}? " if close else "")
                + f"fix `relation:` (or the dataset's name); `combined discover {source}` "
                "lists the relations",
                source=source,
                dataset=request.dataset,
            ) from None
        _check_columns(where, request, found)
        _check_names(source, request, found)
        _check_flag(where, project.dataset(source, request.dataset).deletes, found)


def _closest_relation(conn: Source, relation: str) -> str | None:
    """The source's relation spelt most like ``relation``, by its whole name or by its
    name without schema (``custmers`` for ``public.customers``), if one is close."""
    try:
        names = [d.relation for d in conn.discover().datasets]
    except CombinedError:
        return None
    by = {n: n for n in names} | {n.rsplit(".", 1)[-1]: n for n in names if n.count(".") == 1}
    close = difflib.get_close_matches(relation, list(by), n=1, cutoff=0.75)
    return by[close[0]] if close else None


def _check_flags(project: Project, source: str, datasets: Sequence[str], conn: Source) -> None:
    """Refuse a soft-delete flag the relation lacks, or whose type cannot mark deletes.

    Asked before every capture of a dataset that declares one (a relation
    described is one catalog query): a flag read the wrong way would delete
    live rows.
    """
    describe = getattr(conn, "describe_relation", None)
    if describe is None:
        return
    for name in datasets:
        d = project.dataset(source, name)
        if d.deletes is not None:
            _check_flag(f"dataset {source}.{name}", d.deletes, describe(d.relation))


def _check_flag(where: str, deletes: DeletesConfig | None, found: DatasetDiscovery) -> None:
    if deletes is None:
        return
    fields = {f.name: f for f in found.fields}
    flag = deletes.flag
    if flag not in fields:
        close = difflib.get_close_matches(flag, list(fields), n=1)
        raise ConfigError(
            f"{where}: soft-delete flag {flag!r} is not a column of {found.relation!r}",
            hint=(f"did you mean {close[0]!r}? " if close else "")
            + f"fix `deletes: {{flag: ...}}`; its columns: {', '.join(fields)}",
        )
    field = fields[flag]
    problem = misfit(field.arrow_type, field.source_type, deletes.value)
    if problem:
        raise ConfigError(
            f"{where}: soft-delete flag {flag!r} has type {field.source_type} "
            f"({field.arrow_type}): {problem}",
            hint=fix_hint(flag),
        )


def _check_columns(where: str, request: ReadRequest, found: DatasetDiscovery) -> None:
    types = {f.name: f.arrow_type for f in found.fields}
    named = [("key column", c) for c in request.key]
    named += [("column", c) for c in request.columns or ()]
    if request.cursor is not None:
        named.append(("cursor column", request.cursor.column))
    for what, column in named:
        if column not in types:
            close = difflib.get_close_matches(column, list(types), n=1)
            raise ConfigError(
                f"{where}: {what} {column!r} is not a column of {found.relation!r}",
                hint=(f"did you mean {close[0]!r}? " if close else "")
                + f"its columns: {', '.join(types)}",
                dataset=request.dataset,
            )
    if request.cursor is not None:
        _check_cursor_type(where, request.cursor, types[request.cursor.column])


def _check_names(source: str, request: ReadRequest, found: DatasetDiscovery) -> None:
    """Refuse a column name the lake cannot store as read (as each capture would)."""
    chosen = {*request.key, *(request.columns or ())}
    names = [f.name for f in found.fields if not request.columns or f.name in chosen]
    try:
        check_names(f"{source}.{request.dataset}", names)
    except SchemaMismatch as exc:
        raise ConfigError(exc.message, hint=exc.hint, dataset=request.dataset) from None


def _check_cursor_type(where: str, cursor: CursorSpec, arrow_type: str) -> None:
    if arrow_type.startswith(_UNORDERED):
        raise ConfigError(
            f"{where}: cursor column {cursor.column!r} has type {arrow_type}, "
            "which no cursor can order by",
            hint="choose a number, date, time or text column that only grows",
        )
    if isinstance(cursor.lookback, timedelta) and arrow_type.startswith(_NUMERIC):
        raise ConfigError(
            f"{where}: cursor column {cursor.column!r} holds numbers ({arrow_type}), "
            f"but its lookback is the duration {format_duration(cursor.lookback)}",
            hint="state the lookback in the column's own units (a number), or use a time column",
        )
