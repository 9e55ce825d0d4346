"""Helpers shared by the SQL connectors (PostgreSQL, MariaDB)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

from combined.errors import ConfigError


class Closable(Protocol):
    """A session whose ``close`` returns its failure instead of raising."""

    def close(self) -> BaseException | None:
        """Close; return the first failure."""
        ...


def split_qualified(text: str, quote: str, hint: str) -> list[str]:
    """``a.b`` as its parts (one or two); ``quote`` quotes a part, doubled inside it.

    Raises :class:`~combined.errors.ConfigError` with ``hint`` for an empty
    part, an unclosed quote or more than two parts.
    """
    parts: list[str] = []
    buf: list[str] = []
    i, quoted = 0, False
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == quote and text[i + 1 : i + 2] == quote:
                buf.append(quote)
                i += 1
            elif ch == quote:
                quoted = False
            else:
                buf.append(ch)
        elif ch == quote and not buf:
            quoted = True
        elif ch == ".":
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    parts.append("".join(buf))
    if quoted or not all(parts) or len(parts) > 2:
        raise ConfigError(f"{text!r} is not a relation name", hint=hint)
    return parts


def close_quietly(
    session: Closable | None,
    primary: BaseException | None,
    detail: Callable[[BaseException], str],
) -> BaseException | None:
    """Close ``session``; a failure becomes a note on ``primary`` (its ``detail``), never raised."""
    if session is None:
        return None
    failure = session.close()
    if failure is not None and primary is not None:
        with contextlib.suppress(Exception):
            primary.add_note("cleanup also failed: " + detail(failure))
    return failure


__all__ = ["Closable", "close_quietly", "split_qualified"]
