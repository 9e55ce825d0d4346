"""The statements of the binlog that act on a table without row events, as the server parses them.

The log holds a statement's text as its client sent it: comments in, the
optional words (``TRUNCATE [TABLE]``, ``ALTER [ONLINE] [IGNORE] TABLE``) as
written. :func:`statement` removes comments (keeping the text of an
executable ``/*! ... */`` or ``/*M! ... */``, which the server runs) and
:func:`table_statement` finds the verb and the text after the table word;
:func:`touching` judges a statement against the captured table (one that
moves its rows without row events cannot pass).
"""

from __future__ import annotations

import re

from combined.connectors.mariadb._binlog_setup import RESNAPSHOT
from combined.connectors.mariadb._connect import quote_ident
from combined.errors import NeedsSnapshot

_SINGLE = r"'(?:[^'\\]|\\.|'')*'"
_DOUBLE = r'"(?:[^"\\]|\\.|"")*"'
#: A quoted string or name (kept whole), an executable comment (its text
#: kept), or a comment (removed).
_LEXEME = re.compile(
    rf"({_SINGLE}|{_DOUBLE}|`(?:[^`]|``)*`)"
    r"|/\*M?!\d*(.*?)\*/"
    r"|/\*.*?\*/|--(?=\s|$)[^\n]*|\#[^\n]*",
    re.DOTALL,
)
_LITERAL = re.compile(f"{_SINGLE}|{_DOUBLE}")
_DDL = re.compile(
    r"^\s*(?:(truncate)\s+(?:table\s+)?"
    r"|(drop|rename|alter|create\s+or\s+replace)\s+(?:(?:online|ignore)\s+)*"
    r"(?:temporary\s+)?tables?\s+)"
    r"(?:if\s+exists\s+)?(.*)$",
    re.IGNORECASE | re.DOTALL,
)
#: ALTER TABLE clauses that remove, replace or bring in rows, or move the
#: table, without row events.
_ALTER_MOVES = re.compile(
    r"\b(rename(?!\s+(?:column|index|key)\b)|(?:truncate|drop|exchange)\s+partition"
    r"|convert\s+(?:partition|table)|(?:discard|import)\s+(?:partition\s+.+?\s+)?tablespace)\b",
    re.IGNORECASE | re.DOTALL,
)


def statement(query: str) -> str:
    """``query`` without its comments, an executable comment's text in its place."""

    def keep(found: re.Match[str]) -> str:
        if found.group(1) is not None:
            return found.group(1)
        return f" {found.group(2)} " if found.group(2) is not None else " "

    return _LEXEME.sub(keep, query)


def table_statement(text: str) -> tuple[str, str] | None:
    """The verb (``truncate``, ``drop``, ``rename``, ``alter`` or ``replace``) of a
    statement on tables, and its text after the table word; None for another statement."""
    found = _DDL.match(text)
    if found is None:
        return None
    verb = (found.group(1) or found.group(2)).lower()
    return ("replace" if verb.startswith("create") else verb), found.group(3)


_DROP_DATABASE = re.compile(
    r"^\s*drop\s+(?:database|schema)\s+(?:if\s+exists\s+)?(`(?:[^`]|``)+`|[\w$]+)\s*;?\s*$",
    re.IGNORECASE,
)


def dropped_database(text: str) -> str | None:
    """The database a ``DROP DATABASE`` (or ``SCHEMA``) statement drops, or None: its
    tables leave without row events, nor a statement naming them."""
    found = _DROP_DATABASE.match(text)
    if found is None:
        return None
    name = found.group(1)
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


#: ``ALTER IGNORE TABLE`` deletes the rows a new unique key finds duplicates of, unlogged.
_IGNORED = re.compile(r"^\s*alter\s+(?:online\s+)?ignore\b", re.IGNORECASE)
_UNIQUE = re.compile(
    r"\badd\s+(?:constraint\s*(?:`(?:[^`]|``)*`|\w+)?\s*)?(unique|primary\s+key)\b",
    re.IGNORECASE,
)


def moving_clause(rest: str, text: str = "") -> str | None:
    """The clause of an ALTER TABLE that moves rows without row events (None: none);
    ``text``, the whole statement, tells an ``ALTER IGNORE``."""
    bare = _LITERAL.sub("''", rest)
    found = _ALTER_MOVES.search(bare)
    if found is not None:
        return " ".join(found.group(1).split())
    unique = _UNIQUE.search(bare) if _IGNORED.match(text) else None
    if unique is not None:
        return f"ignore ... add {' '.join(unique.group(1).split()).lower()}: duplicates deleted"
    return None


_WORD = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_NAME = rf"({_WORD}(?:\s*\.\s*{_WORD})?)"
#: The other table of an ALTER TABLE whose rows it swaps or takes without row events.
_SWAPPED = re.compile(rf"\b(?:with|convert)\s+table\s+{_NAME}", re.IGNORECASE)
_KEYWORDS = {"to", "if", "exists", "restrict", "cascade", "wait", "nowait", "force"}
_DML = re.compile(r"^\s*(insert|update|delete|replace|load)\b", re.IGNORECASE)


def _names(text: str) -> tuple[str | None, str]:
    """(database or None, table) of a name the log's statement wrote (``_NAME``).

    A dot inside backquotes is the name's own (`` `x.y` `` is table ``x.y``).
    """
    found = re.fullmatch(rf"({_WORD})(?:\s*\.\s*({_WORD}))?", text.strip())
    if found is None:
        return None, text.strip()
    parts = [_unquoted(p) for p in found.groups() if p is not None]
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


def _unquoted(word: str) -> str:
    """A name as written (``_WORD``), its backquotes taken off."""
    return word[1:-1].replace("``", "`") if word.startswith("`") else word


class TableMoved(NeedsSnapshot):
    """A statement in the log moved the table's rows without row events (a ``DROP``, a
    rename, a partition emptied ...). The changes logged before it hold: a read that met
    some stops there and ends (they are committed), and the next read, which starts at
    the statement, fails with this."""


def touching(query: str, schema: str, database: str, table: str) -> tuple[str, str] | None:
    """The verb and the text after the table word (:func:`table_statement`) of a statement
    in the log (run in ``schema``) that acts on ``database.table`` and may pass (a
    ``TRUNCATE``, an ``ALTER TABLE``), or None: a statement that does not act on it.

    Raises :class:`~combined.errors.NeedsSnapshot` for one that cannot pass: rows
    left or moved without row events, or rows changed by a statement logged as such.
    """
    text = statement(query)
    ddl = table_statement(text)
    if dropped_database(text) == database:  # (its tables go unnamed)
        ddl = ("drop", f"{quote_ident(database)}.{quote_ident(table)}")
    if ddl is None:
        if _DML.match(text) and re.search(rf"\b{re.escape(table)}\b", text):
            raise NeedsSnapshot(
                f"a statement changing {database}.{table} was logged as a statement, "
                "not as rows (binlog_format other than ROW in the writing session): "
                "its rows cannot be known",
                hint="SET GLOBAL binlog_format = 'ROW' and reconnect the writers, then take "
                f"a new snapshot: {RESNAPSHOT}",
            )
        return None
    verb, rest = ddl
    found = [m.group(1) for m in re.finditer(_NAME, rest)]
    if verb in ("truncate", "alter", "replace"):
        # the statement's one table, and the table an ALTER swaps a partition with (or
        # makes one): the rest are its clauses
        found = found[:1] + [m.group(1) for m in _SWAPPED.finditer(rest) if verb == "alter"]
    names = [_names(n) for n in found if n.lower() not in _KEYWORDS]
    if not any((db or schema) == database and t == table for db, t in names):
        return None
    moved = moving_clause(rest, text) if verb == "alter" else None
    if verb in ("drop", "rename", "replace") or moved is not None:
        what = {"drop": "dropped", "rename": "renamed"}.get(verb) or (
            f"altered ({moved})" if moved else "replaced (CREATE OR REPLACE TABLE)"
        )
        raise TableMoved(
            f"table {database}.{table} was {what} since the last capture: rows "
            "left or moved without a change in the binlog, and the lake cannot follow",
            hint=f"take a new snapshot: {RESNAPSHOT}",
        )
    return verb, rest
