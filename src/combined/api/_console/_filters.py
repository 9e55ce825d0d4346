"""How the console's templates show instants, durations, ids and JSON bodies."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from jinja2 import Environment

from combined.api._json import jsonable


def when(value: datetime | None) -> str:
    """An instant in UTC to the second (``-`` for none)."""
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def duration(value: timedelta | float | None) -> str:
    """A duration for people: ``3 s``, ``4 min 2 s``, ``2 h 5 min``, ``3 d 4 h``."""
    if value is None:
        return "-"
    seconds = int(value.total_seconds() if isinstance(value, timedelta) else value)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def took(start: datetime | None, end: datetime | None) -> str:
    """How long from ``start`` to ``end`` (to now while ``end`` is None)."""
    if start is None:
        return "-"
    from combined.protocol import utcnow

    return duration((end or utcnow()) - start)


def compact(value: Any, limit: int = 400) -> str:
    """A JSON body on one line, cut at ``limit`` characters."""
    text = json.dumps(jsonable(value), sort_keys=True, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cell(value: Any, limit: int = 120) -> str:
    """A record's value in a table cell: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[: limit - 1] + "…"
    return compact(value, limit)


def register(env: Environment) -> None:
    """Give ``env`` the console's filters."""
    env.filters.update(when=when, duration=duration, compact=compact, took=took, cell=cell)
