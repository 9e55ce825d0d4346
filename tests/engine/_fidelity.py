"""The dialect-free half of the random fidelity tests (``test_fidelity_random.py``).

A :class:`Kind` is one column type: how to declare it, how to draw a value of
it (as a SQL literal of the dialect), and how a value reads back in one
canonical form from either side. The source side is always the server's own
text of the value (``source``); the lake side is the value the published
projection returns through DuckDB, dates and timestamps as their integer
days and microseconds since 1970 (``lake``). Both map to the same Python
value, so the comparison is by value and exact: floats by their bits (NaN,
-0.0 and infinities told apart), decimals as plain text at their scale,
dates as days and timestamps as microseconds (years before 1 and after 9999
included), times of day as microseconds.

How each lake value maps back to the source's text:

=========================================  ===========================================
lake value (DuckDB over the Delta table)   canonical form, and the source text's
=========================================  ===========================================
integers; decimal(20,0) (bigint unsigned,  the integer (``int(text)``)
bit(64)); bool of bit(1) or boolean        (PostgreSQL's boolean: ``text == "t"``)
float32 / float64                          ``repr`` of the float (``nan`` one value),
                                           the text parsed (float32: rounded to it)
decimal(p,s); text of a decimal over 38    plain text at the scale (``1.50``), from
digits                                     ``Decimal(text)``
date32 / timestamp                         days / microseconds since 1970 (the text's
                                           proleptic Gregorian date, ``BC`` and offsets)
text of a time of day                      microseconds of the day, both texts parsed
text (text, json, uuid, inet, enum, ...)   the text itself, equal to the source's
binary                                     the bytes (PostgreSQL's ``\\x..`` decoded)
list                                       a tuple of the elements' forms (NULLs kept)
=========================================  ===========================================
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from random import Random
from typing import Any

import pyarrow as pa

Draw = Callable[[Random], str]
Canon = Callable[[Any], Any]

# Text pieces every string column draws from: quotes, backslashes, control
# characters (no NUL, which neither server stores in text), the BMP's odd
# corners and characters outside it.
PIECES = [
    "a",
    "Z",
    "0",
    " ",
    "'",
    "''",
    '"',
    "\\",
    "\\\\",
    "\\n",
    "%",
    "_",
    "\t",
    "\n",
    "\r",
    "\x01",
    "\x1f",
    "\x7f",
    "\x81",
    "\x9d",
    "é",
    "ß",
    "€",
    "ÿ",
    "中文",
    "\u200b",
    "\ufeff",
    "\u2028",
    "\ufffd",
    "😀",
    "𝄞",
    "\U0010fffd",
    "{",
    "}",
    ",",
    "NULL",
]


@dataclass(frozen=True)
class Kind:
    """One column type of a dialect."""

    ddl: str
    draw: Draw
    source: Canon
    lake: Canon
    key: bool = False
    array: bool = False
    notes: str = ""
    select: str = ""  # the source expression of the column's text, "" for the dialect's own
    extra: tuple[str, ...] = field(default=())  # statements the type needs first


def text(rng: Random, fits: Callable[[str], bool] = lambda _: True, most: int = 12) -> str:
    """A string of the pieces that ``fits`` allows; now and then long (TOASTed)."""
    pieces = [p for p in PIECES if fits(p)]
    roll = rng.random()
    if roll < 0.1:
        return ""
    if roll < 0.14 and most >= 4000:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(2000, 4000)))
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, most)))[:most]


def edge_int(rng: Random, lo: int, hi: int) -> int:
    """An integer of [lo, hi], the edges often."""
    return rng.choice([lo, hi, 0 if lo <= 0 else lo, -1 if lo < 0 else hi - 1, rng.randint(lo, hi)])


def edge_decimal(rng: Random, precision: int, scale: int) -> str:
    """The text of a decimal(precision, scale) value, the largest and smallest often."""
    whole = precision - scale
    top = "9" * whole if whole else "0"
    frac = "9" * scale
    choice = rng.randrange(6)
    if choice == 0:
        body = f"{top}.{frac}" if scale else top
    elif choice == 1:
        body = f"0.{'0' * (scale - 1)}1" if scale else "1"
    elif choice == 2:
        body = "0"
    else:
        digits = "".join(rng.choice("0123456789") for _ in range(precision))
        body = (digits[:whole] or "0") + ("." + digits[whole:] if scale else "")
    return ("-" if rng.random() < 0.4 else "") + body


def ints(lo: int, hi: int) -> Draw:
    """Integers of [lo, hi], the edges often."""
    return lambda rng: str(edge_int(rng, lo, hi))


def floats(edges: list[str]) -> Draw:
    """Floats: one of ``edges`` half the time, else any magnitude."""

    def draw(rng: Random) -> str:
        if rng.random() < 0.5:
            return rng.choice(edges)
        return repr(rng.uniform(-1, 1) * 10 ** rng.randint(-40, 40))

    return draw


def clock(rng: Random) -> str:
    """A time of day with microseconds, its edges often."""
    h, m, s = rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59)
    micro = rng.choice([0, 1, 999999, rng.randint(0, 999999)])
    return f"{h:02d}:{m:02d}:{s:02d}.{micro:06d}"


# -- canonical forms ---------------------------------------------------------


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year, astronomical)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


STAMP = re.compile(
    r"^(\d+)-(\d\d)-(\d\d)(?:[ T](\d\d):(\d\d):(\d\d)(?:\.(\d+))?)?"
    r"(?:([+-])(\d\d)(?::?(\d\d))?(?::(\d\d))?)?( BC)?$"
)


def stamp_micros(value: str) -> int:
    """Microseconds since 1970 of a date or timestamp text (PostgreSQL's, MariaDB's)."""
    m = STAMP.match(value)
    if m is None:
        raise AssertionError(f"not a timestamp text: {value!r}")
    y, mo, d, hh, mi, ss, frac, sign, oh, om, osec, bc = m.groups()
    year = 1 - int(y) if bc else int(y)
    days = days_from_civil(year, int(mo), int(d))
    micros = ((int(hh or 0) * 60 + int(mi or 0)) * 60 + int(ss or 0)) * 1_000_000
    micros += int((frac or "").ljust(6, "0")[:6] or 0)
    offset = (int(oh or 0) * 60 + int(om or 0)) * 60 + int(osec or 0)
    micros -= (-1 if sign == "-" else 1) * offset * 1_000_000
    return days * 86_400_000_000 + micros


def date_days(value: str) -> int:
    """Days since 1970 of a date text."""
    return stamp_micros(value) // 86_400_000_000


def time_micros(value: str) -> int:
    """Microseconds of a time-of-day text ``HH:MM:SS[.ffffff]``."""
    m = re.fullmatch(r"(-?)(\d+):(\d\d):(\d\d)(?:\.(\d+))?", value)
    if m is None:
        raise AssertionError(f"not a time text: {value!r}")
    sign, h, mi, s, frac = m.groups()
    micros = ((int(h) * 60 + int(mi)) * 60 + int(s)) * 1_000_000
    micros += int((frac or "").ljust(6, "0")[:6] or 0)
    return -micros if sign else micros


def lake_time(value: str) -> Any:
    """The lake's text of a time of day: ``HH:MM:SS.ffffff`` always (else it stays unequal)."""
    if re.fullmatch(r"\d\d:\d\d:\d\d\.\d{6}", value) is None:
        return ("not HH:MM:SS.ffffff", value)
    return time_micros(value)


def double_bits(value: float) -> str:
    """A float's identity: its text, with NaN as one value and -0.0 kept apart from 0.0."""
    if math.isnan(value):
        return "nan"
    return repr(value)


def single_bits(value: float) -> str:
    """The float32 a number rounds to, as :func:`double_bits`."""
    return double_bits(struct.unpack("f", struct.pack("f", value))[0])


def plain_decimal(value: Any) -> str:
    """A decimal as plain text at its own scale (``1.50``, never ``1.5E+0``)."""
    return format(Decimal(str(value)) if not isinstance(value, Decimal) else value, "f")


def same(value: Any) -> Any:
    """The value itself."""
    return value


def as_int(value: Any) -> int:
    """An integer from its text, a Decimal (``decimal(20,0)``) or a bool."""
    return int(value)


# -- reading the lake ----------------------------------------------------------


def plain(array: pa.ChunkedArray) -> list[Any]:
    """A lake column as Python values, dates and timestamps as integers (any year)."""
    t = array.type
    inner = t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else t
    as_int = pa.int32() if pa.types.is_date32(inner) else pa.int64()
    if pa.types.is_date32(inner) or pa.types.is_timestamp(inner):
        array = array.cast(as_int if inner is t else pa.list_(as_int))
    values: list[Any] = array.to_pylist()
    return values


def lake_rows(
    table: pa.Table, kinds: Sequence[Kind], names: Sequence[str]
) -> list[tuple[Any, ...]]:
    """The published rows of ``names`` in canonical form."""
    columns = []
    for name, kind in zip(names, kinds, strict=True):
        values = plain(table.column(name))
        columns.append([canon(kind.lake, kind.array, v) for v in values])
    return list(zip(*columns, strict=True)) if columns else []


def canon(mapping: Canon, array: bool, value: Any) -> Any:
    """``mapping`` of a value, of each element of an array; NULL stays None."""
    if value is None:
        return None
    if array:
        return tuple(None if v is None else mapping(v) for v in value)
    return mapping(value)


def ordered(rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows in a fixed order (values of mixed types and NULLs compare by repr)."""
    return sorted(rows, key=repr)


def differences(source: list[tuple[Any, ...]], lake: list[tuple[Any, ...]]) -> str:
    """What one side holds that the other does not, as a short text (empty when equal)."""
    src, lk = ordered(source), ordered(lake)
    if src == lk:
        return ""
    only_src = [r for r in src if r not in lk]
    only_lake = [r for r in lk if r not in src]
    return (
        f"source {len(src)} rows, lake {len(lk)};"
        f"\n  only in source: {short(only_src[:3])}\n  only in lake: {short(only_lake[:3])}"
    )


def short(value: Any) -> str:
    """``repr`` with long strings and bytes cut to their start, length and a digest."""
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(short(v) for v in value) + ")"
    if isinstance(value, (str, bytes)) and len(value) > 40:
        import hashlib

        raw = value.encode() if isinstance(value, str) else value
        return f"{value[:12]!r}..<{len(value)} md5 {hashlib.md5(raw).hexdigest()[:8]}>"
    return repr(value)
