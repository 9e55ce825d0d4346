"""Soft deletes: a row whose flag column says deleted is projected as a delete of its key.

A dataset declares ``deletes: {flag: COLUMN}`` (a boolean: ``true`` means
deleted; a date or time: any value means deleted) or ``deletes: {flag:
COLUMN, value: V}`` (the column's text equals ``V``). The reduction turns
such a row's operation into ``delete`` (see :mod:`combined.capture._reduce`):
the Delivery keeps the row as read, flag included, with that operation, so
the commit, MAR, ``explain`` and ``replay`` all read the delete from the raw
layer as they read any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from combined.errors import ConfigError
from combined.protocol.identity import quote_ident

#: Arrow types (their text) a flag without ``value`` is read from: set means deleted.
_TEMPORAL = ("timestamp", "date", "time")
_INTEGER = ("int", "uint")
_TEXT = ("string", "large_string", "string_view")


def spec_of(deletes: Any) -> dict[str, Any] | None:
    """The frozen form of a dataset's ``deletes:`` (its admission and plan hold it)."""
    if deletes is None:
        return None
    return {"flag": deletes.flag, "value": deletes.value}


def _value_text(value: object) -> str:
    """The text a flag's ``value`` is compared as (a boolean as DuckDB writes one)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def misfit(arrow_type: str, source_type: str | None, value: object = None) -> str | None:
    """Why a column of ``arrow_type`` cannot be the flag (with ``value``), or None when it can.

    ``source_type`` (the source's own type name, when known) lets a text
    column count as a time written as text (SQLite's DATE and TIMESTAMP
    columns); unknown (None), any text column is taken as one.
    """
    t = arrow_type.lower()
    if value is None:
        if t == "bool" or t.startswith(_TEMPORAL):
            return None
        if t.startswith(_TEXT) and (
            source_type is None or any(w in source_type.upper() for w in ("DATE", "TIME"))
        ):
            return None
        return (
            "without `value:` the flag must be a boolean (true means deleted) or a date or "
            "time (set means deleted)"
        )
    if isinstance(value, bool):
        fits = t == "bool"
        kind = "a boolean"
    elif isinstance(value, int):
        fits = t.startswith(_INTEGER) or t == "bool"
        kind = "an integer"
    else:
        fits = t.startswith(_TEXT)
        kind = "text"
    return None if fits else f"`value: {value!r}` is {kind}, which it cannot hold"


def fix_hint(flag: str) -> str:
    """What to do about a flag column that cannot mark deletes."""
    return (
        f"name a boolean or date/time column in `deletes: {{flag: ...}}`, or give the value "
        f"that means deleted: `deletes: {{flag: {flag}, value: <value>}}`"
    )


def deleted_sql(spec: Mapping[str, Any], schema: pa.Schema, where: str) -> str:
    """SQL (DuckDB, over the staged columns): whether a row's flag says deleted.

    Raises :class:`ConfigError` when the capture holds no flag column, or one
    whose type cannot mark deletes (``where`` names the dataset).
    """
    flag, value = str(spec["flag"]), spec.get("value")
    if flag not in schema.names:
        raise ConfigError(
            f"{where}: the soft-delete flag {flag!r} is not a column of the capture; "
            "nothing was committed",
            hint=f"fix `deletes: {{flag: ...}}` (its columns: {', '.join(schema.names)})",
        )
    arrow_type = schema.field(flag).type
    problem = misfit(str(arrow_type), None, value)
    if problem:
        raise ConfigError(
            f"{where}: the soft-delete flag {flag!r} has type {arrow_type}: {problem}",
            hint=fix_hint(flag),
        )
    column = quote_ident(flag)
    if value is not None:
        text = _value_text(value).replace("'", "''")
        return f"coalesce(CAST({column} AS VARCHAR) = '{text}', false)"
    if pa.types.is_boolean(arrow_type):
        return f"coalesce({column}, false)"
    return f"{column} IS NOT NULL"


def says_deleted(spec: Mapping[str, Any], value: object) -> bool:
    """Whether a flag's ``value`` (as read back from the raw layer) marks its row deleted."""
    wanted = spec.get("value")
    if wanted is not None:
        return value is not None and _value_text(value) == _value_text(wanted)
    return value is True or (value is not None and not isinstance(value, bool))


def describe(spec: Mapping[str, Any] | None) -> str | None:
    """The rule in words (``plan``, ``explain``), or None without one."""
    if not spec:
        return None
    flag, value = spec["flag"], spec.get("value")
    if value is None:
        return f"soft-delete flag {flag} (true or set means deleted)"
    return f"soft-delete flag {flag} = {_value_text(value)!r}"
