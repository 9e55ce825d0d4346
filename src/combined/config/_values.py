"""Values of the project file below the models: sizes, durations, counts, text.

Each validator raises an error of type ``combined`` whose context carries a
``hint`` and, when the problem sits below the field being validated, its
location ``at``; the loader turns them into one
:class:`~combined.errors.ConfigError`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Annotated

from pydantic import PlainSerializer, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from combined.config._secrets import Problem, join_path

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

# ---------------------------------------------------------------------------
# errors raised by validators


def _error(predicate: str, hint: str, at: Sequence[str | int] = ()) -> PydanticCustomError:
    """A validation error the loader can render with its hint and location."""
    shown = f"{join_path(at)} {predicate}" if at else predicate
    return PydanticCustomError(
        "combined",
        "{shown}",
        {"shown": shown, "predicate": predicate, "hint": hint, "at": tuple(at)},
    )


def _errors(problems: Sequence[Problem]) -> PydanticCustomError:
    """One validation error carrying several problems, each with its own hint."""
    at, predicate, hint = problems[0]
    error = _error(predicate, hint, at)
    if len(problems) > 1:
        more = f" (and {len(problems) - 1} more)"
        error = PydanticCustomError(
            "combined",
            "{shown}",
            {**(error.context or {}), "shown": f"{error.message()}{more}", "problems": problems},
        )
    return error


# ---------------------------------------------------------------------------
# sizes and durations

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
}
_SIZE_HINT = (
    "write a whole number of bytes or a number with a unit: B, KB, MB, GB, KiB, MiB, GiB, TiB"
)

_DURATION = re.compile(r"^\s*(?:\d+(?:\.\d+)?\s*(?:ms|s|m|h|d|w)\s*)+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)")
_DURATION_US = {
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
    "w": 604_800_000_000,
}
_DURATION_HINT = "write a number with a unit, such as 30s, 5m, 2h, 1d or 1w (combine them as 1h30m)"


def parse_size(value: int | str) -> int:
    """Bytes in ``value``: an int, or text such as ``"64MiB"``, ``"20 GB"``, ``"1.5GiB"``.

    Decimal units (KB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB,
    GiB, TiB) powers of 1024. Raises ``ValueError`` for anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    factor = _SIZE_UNITS.get(match.group(2).lower()) if match else None
    if match is None or factor is None:
        raise ValueError(f"{value!r} is not a size")
    return int(Decimal(match.group(1)) * factor)


def parse_duration(value: str | timedelta) -> timedelta:
    """The duration in ``value``: text such as ``"30s"``, ``"5m"``, ``"1h30m"``, ``"7d"``.

    Units are ms, s, m (minutes), h, d and w. A bare number is refused because
    its unit would be a guess. Raises ``ValueError`` for anything else.
    """
    if isinstance(value, timedelta):
        return value
    if not isinstance(value, str) or not _DURATION.match(value):
        raise ValueError(f"{value!r} is not a duration")
    micros = Decimal(0)
    for number, unit in _DURATION_PART.findall(value):
        micros += Decimal(number) * _DURATION_US[unit]
    try:
        return timedelta(microseconds=int(micros))
    except OverflowError:
        raise ValueError(f"{value!r} is too long a duration") from None


def format_duration(value: timedelta) -> str:
    """``value`` as text that :func:`parse_duration` reads back exactly (``"1h30m"``)."""
    micros = value // timedelta(microseconds=1)
    if micros < 0:
        return f"-{format_duration(-value)}"
    parts: list[str] = []
    for unit in ("d", "h", "m"):
        count, micros = divmod(micros, _DURATION_US[unit])
        if count:
            parts.append(f"{count}{unit}")
    seconds, fraction = divmod(micros, 1_000_000)
    if fraction:
        parts.append(f"{seconds}.{fraction:06d}".rstrip("0") + "s")
    elif seconds or not parts:
        parts.append(f"{seconds}s")
    return "".join(parts)


def _size(value: object) -> int:
    try:
        size = parse_size(value)  # type: ignore[arg-type]
    except (ValueError, InvalidOperation):
        raise _error(f"must be a size such as 64MiB, not {value!r}", _SIZE_HINT) from None
    if size <= 0:
        raise _error(f"must be a size above zero, not {value!r}", _SIZE_HINT)
    return size


def _duration(value: object) -> timedelta:
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise _error(f"is a number without a unit: {value!r}", _DURATION_HINT)
    try:
        duration = parse_duration(value)  # type: ignore[arg-type]
    except ValueError:
        raise _error(f"must be a duration such as 1h, not {value!r}", _DURATION_HINT) from None
    if duration <= timedelta(0):
        raise _error(f"must be a duration above zero, not {value!r}", _DURATION_HINT)
    return duration


def _lookback(value: object) -> int | float | timedelta:
    # A number is in the cursor's own units (ids, versions); text is a time span.
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise _error(f"must not be negative, not {value!r}", "use 0 for no overlap")
        return value
    if isinstance(value, str | timedelta):
        try:
            lookback = parse_duration(value)
        except ValueError:
            pass
        else:
            if lookback >= timedelta(0):
                return lookback
    raise _error(
        f"must be a number or a duration such as 5m, not {value!r}",
        "use a number in the cursor column's units, or a duration for a time cursor: "
        + _DURATION_HINT.removeprefix("write "),
    )


def _format_lookback(value: int | float | timedelta) -> int | float | str:
    return format_duration(value) if isinstance(value, timedelta) else value


def _count(value: object) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _error(
            f"must be a whole number above zero, not {value!r}", "write a number like 1000"
        )
    return value


_BOOLEAN_HINT = "quote it: YAML reads an unquoted yes, no, on, off, true or false as a boolean"


def _text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        hint = _BOOLEAN_HINT if isinstance(value, bool) else "write a value, quoted if needed"
        raise _error(f"must be non-empty text, not {value!r}", hint)
    return value


# What editors see of each value (the JSON Schema, ``combined schema``): the
# validators above stay the authority, these only describe what they take.
SIZE_PATTERN = r"^\s*\d+(\.\d+)?\s*([bB]|[kKmMgGtT][iI]?[bB])?\s*$"
DURATION_PATTERN = r"^\s*(\d+(\.\d+)?\s*(ms|s|m|h|d|w)\s*)+$"
_SIZE_SCHEMA = {
    "anyOf": [
        {"type": "integer", "exclusiveMinimum": 0},
        {"type": "string", "pattern": SIZE_PATTERN},
    ],
    "examples": ["64MiB", "20GB"],
}
_DURATION_SCHEMA = {"type": "string", "pattern": DURATION_PATTERN, "examples": ["30s", "1h", "7d"]}
_LOOKBACK_SCHEMA = {
    "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": DURATION_PATTERN}]
}
TEXT_SCHEMA = {"type": "string", "minLength": 1, "pattern": r"\S"}

ByteSize = Annotated[int, PlainValidator(_size), WithJsonSchema(_SIZE_SCHEMA)]
"""A positive number of bytes, written as an int or text with a unit."""

Duration = Annotated[
    timedelta,
    PlainValidator(_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema(_DURATION_SCHEMA),
]
"""A positive time span, written as text such as ``"1h"``."""

Lookback = Annotated[
    int | float | timedelta,
    PlainValidator(_lookback),
    PlainSerializer(_format_lookback, when_used="json"),
    WithJsonSchema(_LOOKBACK_SCHEMA),
]
Count = Annotated[int, PlainValidator(_count), WithJsonSchema({"type": "integer", "minimum": 1})]
Text = Annotated[str, PlainValidator(_text), WithJsonSchema(TEXT_SCHEMA)]
