"""The statements of the binlog that act on a table without row events, as the server parses them.

The log holds a statement's text as its client sent it: comments in, the
optional words (``TRUNCATE [TABLE]``, ``ALTER [ONLINE] [IGNORE] TABLE``) as
written. :func:`statement` removes comments (keeping the text of an
executable ``/*! ... */`` or ``/*M! ... */``, which the server runs) and
:func:`table_statement` finds the verb and the text after the table word.
"""

from __future__ import annotations

import re

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
