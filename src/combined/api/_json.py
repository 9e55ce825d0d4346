"""Engine values as JSON, one encoding for every output: the API, ``--format
json|csv``, ``sql``'s results and the governance ledger.

Non-finite floats are the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"`` (JSON has no such numbers, and null would read as SQL NULL);
bytes are lowercase hexadecimal (as identity digests are written everywhere,
docs/identity.md); decimals are text (a JSON number would round them in most
readers); instants, dates and times ISO 8601; durations a number of seconds;
lists and structs arrays and objects, a map an array of ``[key, value]`` pairs
when it arrives as one (its keys need not be text).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any


def decimal_text(value: Decimal) -> str:
    """A decimal's exact text in positional notation (``0.0000000001``, never ``1E-10``)."""
    return format(value, "f")


def jsonable(value: Any) -> Any:
    """``value`` in JSON's types, for a query's values and the catalog's alike."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return decimal_text(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "_mapping"):  # a catalog row
        return jsonable(dict(value._mapping))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return str(value)
