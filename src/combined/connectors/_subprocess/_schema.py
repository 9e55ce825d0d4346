"""JSON Schema (as Singer taps and Airbyte sources write it) to Arrow, and records to Arrow columns.

| JSON Schema | Arrow |
| --- | --- |
| ``integer`` (or ``number`` with ``airbyte_type: integer``) | ``int64`` |
| ``number`` | ``double``; ``decimal128(38, s)`` when ``multipleOf`` is ``10^-s`` or finer |
| ``integer`` and ``number`` together | as ``number`` |
| ``string`` | ``string`` |
| ``string`` with ``format: date-time`` | ``timestamp[us, tz=UTC]`` (RFC 3339, an offset required) |
| ... and ``airbyte_type: timestamp_without_timezone`` | ``timestamp[us]`` (no offset allowed) |
| ``string`` with ``format: date`` | ``date32`` |
| ``boolean`` | ``bool`` |
| ``object``, ``array``, several types, no type | ``string`` holding the value's JSON text |

Airbyte's well-known types (``$ref: WellKnownTypes.json#/definitions/Integer``,
``TimestampWithTimezone``, ...) read as the plain schema they stand for. The
protocol sends a well-known ``Integer`` or ``Number`` as a JSON string
(``"-?(0|[0-9]\\d*)"``, a ``Number`` with ``(\\.\\d+)?``, or ``Infinity``,
``-Infinity``, ``NaN``): such a text is read as the number it spells, exactly
(a ``Decimal``, never through a float), a JSON number as a number; any other
text is refused, and so is a non-finite value where the column has none
(``int64``, a decimal).
``["null", T]`` and ``anyOf: [{...}, {"type": "null"}]`` make a field
nullable; a field that is not nullable refuses an explicit ``null``. A
missing property is null. Every value is checked against its field's type:
one that does not fit is an error naming the field, never a silent null.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from combined.errors import ConfigError

#: The widest decimal the lake keeps exactly (Delta's limit).
MAX_PRECISION = 38

_TIMESTAMP = pa.timestamp("us", tz="UTC")
NAIVE_TIMESTAMP = pa.timestamp("us")

# Airbyte protocol v1's well-known types, as the plain JSON Schema each stands for.
_WELL_KNOWN: Mapping[str, Mapping[str, Any]] = {
    "String": {"type": "string"},
    "BinaryData": {"type": "string"},
    "Boolean": {"type": "boolean"},
    "Integer": {"type": "integer", "combined:as_text": "Integer"},
    "Number": {"type": "number", "combined:as_text": "Number"},
    "Date": {"type": "string", "format": "date"},
    "TimestampWithTimezone": {"type": "string", "format": "date-time"},
    "TimestampWithoutTimezone": {
        "type": "string",
        "format": "date-time",
        "airbyte_type": "timestamp_without_timezone",
    },
    "TimeWithTimezone": {"type": "string", "format": "time"},
    "TimeWithoutTimezone": {"type": "string", "format": "time"},
}
_WELL_KNOWN_PREFIX = "WellKnownTypes.json#/definitions/"
#: What a well-known Integer or Number may be sent as: its digits in a JSON string
#: (the protocol's patterns, whole; ASCII digits only), or a non-finite name.
_AS_TEXT = {
    "Integer": re.compile(r"-?(?:0|[0-9][0-9]*)", re.ASCII),
    "Number": re.compile(r"-?(?:0|[0-9][0-9]*)(?:\.[0-9]+)?", re.ASCII),
}
_NON_FINITE = ("Infinity", "-Infinity", "NaN")


class BadValue(Exception):
    """Value ``index`` of a column does not fit its field: ``expected`` says what would.

    ``at_source``: no declared type would hold it either (the value itself is
    broken), so the fix is the source's.
    """

    def __init__(self, index: int, expected: str, at_source: bool = False) -> None:
        super().__init__(expected)
        self.index = index
        self.expected = expected
        self.at_source = at_source


#: What a text holding a lone UTF-16 surrogate is not (JSON's ``"\ud800"`` decodes to one).
_UNICODE = "text of Unicode characters (a lone surrogate escape such as \\ud800 is none)"


def _unicode_array(values: list[Any], type_: pa.DataType) -> pa.Array:
    """``pa.array(values)``; a text that cannot be UTF-8 (a lone surrogate) raises BadValue."""
    try:
        return pa.array(values, type=type_)
    except UnicodeEncodeError:
        for i, v in enumerate(values):
            try:
                pa.array([v], type=type_)
            except UnicodeEncodeError:
                raise BadValue(i, _UNICODE, at_source=True) from None
        raise


class BadSchema(Exception):
    """A property's schema has no faithful Arrow type."""


@dataclass(frozen=True, slots=True)
class FieldPlan:
    """How one property of a stream becomes one Arrow column."""

    name: str
    kind: str
    arrow: pa.DataType
    source_type: str
    nullable: bool
    #: A ``json`` column's objects written with their keys sorted (``json_keys: sorted``).
    sorted_keys: bool = False
    #: The well-known type (``Integer``, ``Number``) whose values may come as text.
    as_text: str | None = None

    def column(self, values: list[Any]) -> pa.Array:
        """The values as one Arrow array; raises :class:`BadValue` for the first misfit.

        ``None`` is null (an explicit null in a field that is not nullable is
        refused where the record is read, since only there is it told apart
        from a missing property).
        """
        if self.as_text is not None and str in _value_types(values):
            values = _spelled(self, self.as_text, values)
        return _CONVERT[self.kind](self, values)


def _spelled(plan: FieldPlan, known: str, values: list[Any]) -> list[Any]:
    """``values`` with each text read as the number it spells (a well-known ``known``):
    exactly, as ``Decimal``; ``Infinity``, ``-Infinity`` and ``NaN`` as floats where
    the column holds them. Raises :class:`BadValue` for any other text."""
    spelled = _AS_TEXT[known]
    out = list(values)
    for i, v in enumerate(values):
        if type(v) is not str:
            continue
        if v in _NON_FINITE and plan.kind == "float":
            out[i] = float(v)
        elif v not in _NON_FINITE and spelled.fullmatch(v):
            out[i] = Decimal(v)
        else:
            held = "" if plan.kind == "float" else f"; {plan.arrow} holds no {_NONE_OF}"
            raise BadValue(i, f"a number, or its digits as text ({_SPELLED[known]}{held})")
    return out


_NONE_OF = "Infinity, -Infinity or NaN"
#: How the protocol spells a well-known type's value as text, in a few words.
_SPELLED = {
    "Integer": "Airbyte's well-known Integer: 42, -7",
    "Number": f"Airbyte's well-known Number: 4.25, -7, {_NONE_OF}",
}


def _decimal_scale(multiple: Any) -> int | None:
    """The decimals a ``multipleOf`` step needs (0.01 -> 2, 0.25 -> 2, 5 -> 0); None if invalid."""
    try:
        d = Decimal(str(multiple)).normalize()
    except ArithmeticError:
        return None
    exponent = d.as_tuple().exponent
    if not d.is_finite() or d <= 0 or not isinstance(exponent, int):
        return None
    return max(0, -exponent)


def _resolved(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(_WELL_KNOWN_PREFIX):
        known = _WELL_KNOWN.get(ref[len(_WELL_KNOWN_PREFIX) :])
        if known is not None:
            return {**{k: v for k, v in schema.items() if k != "$ref"}, **known}
    return schema


def _types(schema: Mapping[str, Any]) -> tuple[set[str], bool, Mapping[str, Any]]:
    """The non-null JSON types of ``schema``, whether null is allowed, and the branch used."""
    schema = _resolved(schema)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and branches:
        kinds: set[str] = set()
        nullable = False
        chosen: Mapping[str, Any] = {}
        for branch in branches:
            if not isinstance(branch, Mapping):
                continue
            sub, sub_null, picked = _types(branch)
            nullable = nullable or sub_null
            if sub:
                kinds |= sub
                chosen = picked
        if len([b for b in branches if isinstance(b, Mapping) and _types(b)[0]]) > 1:
            return kinds | {"__several__"}, nullable, schema
        return kinds, nullable, chosen
    declared = schema.get("type")
    if declared is None:
        return set(), True, schema
    names = [declared] if isinstance(declared, str) else list(declared)
    kinds = {str(t) for t in names if t != "null"}
    if kinds == {"number"} and schema.get("airbyte_type") == "integer":
        kinds = {"integer"}
    return kinds, "null" in names, schema


def plan_field(name: str, schema: Any) -> FieldPlan:
    """The column plan of one property; raises :class:`BadSchema` when none is faithful."""
    if not isinstance(schema, Mapping):
        schema = {}
    kinds, nullable, branch = _types(schema)
    if kinds == {"integer", "number"}:
        kinds = {"number"}
    if len(kinds) != 1:
        label = "json (" + ("|".join(sorted(k for k in kinds if k != "__several__")) or "any") + ")"
        return FieldPlan(name, "json", pa.string(), label, nullable)
    (kind,) = kinds
    if kind in ("integer", "number") and branch.get("combined:as_text") in _AS_TEXT:
        plan = _plan_kind(name, kind, branch, nullable)
        known = branch["combined:as_text"]
        label = f"{plan.source_type} (well-known {known}: a number or its text)"
        return dataclasses.replace(plan, as_text=known, source_type=label)
    return _plan_kind(name, kind, branch, nullable)


def _plan_kind(name: str, kind: str, branch: Mapping[str, Any], nullable: bool) -> FieldPlan:
    """The column plan of a property of one JSON type ``kind`` (``branch``, its schema)."""
    suffix = ""
    if kind == "integer":
        return FieldPlan(name, "int", pa.int64(), "integer", nullable)
    if kind == "number":
        multiple = branch.get("multipleOf")
        if multiple is not None:
            scale = _decimal_scale(multiple)
            if scale is None:
                raise BadSchema(f"multipleOf {multiple!r} is not a positive number")
            if scale > MAX_PRECISION:
                raise BadSchema(
                    f"multipleOf {multiple!r} needs {scale} decimals, "
                    f"more than the {MAX_PRECISION} an exact decimal holds"
                )
            return FieldPlan(
                name,
                "decimal",
                pa.decimal128(MAX_PRECISION, scale),
                f"number (multipleOf {multiple})",
                nullable,
            )
        return FieldPlan(name, "float", pa.float64(), "number", nullable)
    if kind == "boolean":
        return FieldPlan(name, "bool", pa.bool_(), "boolean", nullable)
    if kind == "string":
        fmt = branch.get("format")
        if fmt == "date-time" and branch.get("airbyte_type") == "timestamp_without_timezone":
            return FieldPlan(
                name, "naive_timestamp", NAIVE_TIMESTAMP, "string (date-time, no zone)", nullable
            )
        if fmt == "date-time":
            return FieldPlan(name, "timestamp", _TIMESTAMP, "string (date-time)", nullable)
        if fmt == "date":
            return FieldPlan(name, "date", pa.date32(), "string (date)", nullable)
        suffix = f" ({fmt})" if isinstance(fmt, str) else ""
        return FieldPlan(name, "string", pa.string(), "string" + suffix, nullable)
    if kind in ("object", "array"):
        return FieldPlan(name, "json", pa.string(), f"{kind} (json text)", nullable)
    raise BadSchema(f"type {kind!r} is not a JSON Schema type")


def plan_stream(schema: Any) -> tuple[FieldPlan, ...]:
    """The column plans of a stream's schema (its ``properties``, in order)."""
    if not isinstance(schema, Mapping):
        raise BadSchema("the schema is not an object")
    properties = schema.get("properties")
    if properties is None:
        properties = {}
    if not isinstance(properties, Mapping):
        raise BadSchema("the schema's properties are not an object")
    plans = []
    for name, sub in properties.items():
        try:
            plans.append(plan_field(str(name), sub))
        except BadSchema as exc:
            raise BadSchema(f"property {name!r}: {exc}") from None
    return tuple(plans)


#: How a ``json`` column writes an object's keys: in the order the source sent them
#: (the default), or sorted, for a source whose order changes from one read to the next.
JSON_KEYS = ("as_sent", "sorted")


def json_keys_option(connector: str, value: Any) -> str:
    """The ``json_keys`` option of a source's config; raises ``ConfigError``."""
    if value not in JSON_KEYS:
        raise ConfigError(
            f"{connector} json_keys must be one of {', '.join(JSON_KEYS)}, not {value!r}",
            hint="sorted writes each object of a json column with its keys sorted, so a "
            "source that sends one object's keys in another order changes no row",
            option="json_keys",
        )
    return str(value)


def keys_written(plan: FieldPlan, json_keys: str) -> FieldPlan:
    """``plan``, its objects' keys sorted when it is a ``json`` column and ``json_keys`` says so."""
    if plan.kind != "json" or json_keys != "sorted":
        return plan
    return dataclasses.replace(
        plan, sorted_keys=True, source_type=f"{plan.source_type}, keys sorted"
    )


# -- conversions --------------------------------------------------------------------------


def _value_types(values: Sequence[Any]) -> set[type]:
    """The types of ``values``, nulls' left out (a column of one type is the rule)."""
    return set(map(type, values)) - {type(None)}


def _first(
    values: Sequence[Any], fits: Callable[[Any], bool], fitting: tuple[type, ...] = ()
) -> int | None:
    """The index of the first value (not a null) that does not fit; None if every one does.

    Every value of a type in ``fitting`` fits: a column of only those is not
    looked at one by one (a call a value cost more than decoding its line).
    """
    if fitting and _value_types(values) <= set(fitting):
        return None
    for i, v in enumerate(values):
        if v is not None and not fits(v):
            return i
    return None


def _checked(
    plan: FieldPlan,
    values: list[Any],
    fits: Callable[[Any], bool] | None,
    expected: str,
    fitting: tuple[type, ...] = (),
) -> pa.Array:
    bad = None if fits is None else _first(values, fits, fitting)
    if bad is not None:
        raise BadValue(bad, expected)
    try:
        return _unicode_array(values, plan.arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        # Only the value that does not fit is worth naming: find it one by one.
        for i, v in enumerate(values):
            try:
                pa.array([v], type=plan.arrow)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                raise BadValue(i, f"{expected} that fits {plan.arrow}") from None
        raise


def integral(v: Any) -> bool:
    """Whether ``v`` is a whole number: an int, or a finite Decimal or float without fraction."""
    if type(v) is int:
        return True
    if isinstance(v, Decimal):
        return v.is_finite() and v == v.to_integral_value()
    return type(v) is float and math.isfinite(v) and v.is_integer()


def _int(plan: FieldPlan, values: list[Any]) -> pa.Array:
    bad = _first(values, integral, (int,))
    if bad is not None:
        raise BadValue(bad, "an integer")
    if _value_types(values) - {int}:
        values = [v if v is None or type(v) is int else int(v) for v in values]
    return _checked(plan, values, None, "an integer")


def _is_number(v: Any) -> bool:
    return type(v) in (int, float) or isinstance(v, Decimal)


#: The integers a double holds exactly: past them, some are rounded.
_EXACT = 2**53


def _double_keeps(v: Any) -> bool:
    """Whether ``v`` is a number a double holds without rounding an integer.

    A fraction is rounded as any double rounds it; an integer past 2**53
    would silently change (12345678901234567890123 to 1.2345678901234568e+22).
    """
    if type(v) is float:
        return True
    if type(v) is int:
        if -_EXACT <= v <= _EXACT:
            return True
        try:
            return int(float(v)) == v
        except OverflowError:
            return False
    if not isinstance(v, Decimal):
        return False
    if not v.is_finite() or abs(v) <= _EXACT or v != v.to_integral_value():
        return True
    as_float = float(v)
    return math.isfinite(as_float) and Decimal(as_float) == v


def _float(plan: FieldPlan, values: list[Any]) -> pa.Array:
    bad = _first(values, _is_number, (int, float, Decimal))
    if bad is not None:
        raise BadValue(bad, "a number")
    try:
        doubles = pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    except OverflowError:  # (an integer past a double's range: found below)
        doubles = None
    if doubles is None or _value_types(values) - {float}:
        # Only a value that reaches 2**53 as a double may be an integer it rounds: those are
        # checked (a column of floats has none to check).
        maybe = (
            range(len(values))
            if doubles is None
            else np.flatnonzero(np.abs(doubles.to_numpy(zero_copy_only=False)) >= _EXACT)
        )
        bad = next((int(i) for i in maybe if not _double_keeps(values[i])), None)
        if bad is not None:
            raise BadValue(
                bad, "an integer a double holds exactly (past 2**53 it would be rounded)"
            )
    assert doubles is not None
    return doubles


def _decimal(plan: FieldPlan, values: list[Any]) -> pa.Array:
    # Numbers arrive as Decimal parsed from the line's text: never through a float.
    return _checked(
        plan,
        values,
        lambda v: type(v) is int or isinstance(v, Decimal),
        "an exact number",
        (int, Decimal),
    )


def _bool(plan: FieldPlan, values: list[Any]) -> pa.Array:
    return _checked(plan, values, lambda v: type(v) is bool, "true or false", (bool,))


def _string(plan: FieldPlan, values: list[Any]) -> pa.Array:
    return _checked(plan, values, lambda v: type(v) is str, "a string", (str,))


def _parsed(plan: FieldPlan, values: list[Any], expected: str) -> pa.Array:
    text = _checked(
        FieldPlan(plan.name, "string", pa.string(), plan.source_type, True),
        values,
        lambda v: type(v) is str,
        expected,
        (str,),
    )
    try:
        return pc.cast(text, plan.arrow)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        for i, v in enumerate(values):
            if v is None:
                continue
            try:
                pc.cast(pa.array([v]), plan.arrow)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise BadValue(i, expected) from None
        raise


def _timestamp(plan: FieldPlan, values: list[Any]) -> pa.Array:
    return _parsed(
        plan, values, "an RFC 3339 date-time with an offset (2024-05-01T12:00:00Z), microseconds"
    )


#: How a date-time's text ends when it has an offset (or Z).
_OFFSET = re.compile(r"(?:[Zz]|[+-]\d\d(?::?\d\d)?)$")


def _timestamp_utc(plan: FieldPlan, values: list[Any]) -> pa.Array:
    # (a date-time without an offset read as UTC, as the source's naive_timestamps says)
    zoned = [v + "Z" if type(v) is str and not _OFFSET.search(v) else v for v in values]
    return _parsed(plan, zoned, "a date-time (2024-05-01T12:00:00, or with an offset)")


def _naive_timestamp(plan: FieldPlan, values: list[Any]) -> pa.Array:
    return _parsed(plan, values, "a date-time without offset (2024-05-01T12:00:00), microseconds")


def _date(plan: FieldPlan, values: list[Any]) -> pa.Array:
    return _parsed(plan, values, "a date (2024-05-01)")


def json_default(value: Any) -> Any:
    """``json.dumps``'s fallback for exact numbers: an integral ``Decimal`` as int, else float.

    A ``Decimal`` that a float would round (``0.99999999999999999``, 20
    digits) raises :class:`InexactNumber`: :func:`json_encoder`'s text then
    writes its digits instead.
    """
    if isinstance(value, Decimal):
        if value.adjusted() > _MOST_DIGITS:  # (1e1000000: a million digits, minutes of CPU)
            raise InexactNumber(value)
        if value == value.to_integral_value():
            return int(value)
        number = float(value)
        # (15 significant digits or fewer in a double's range: a double always holds them)
        digits, exponent = len(value.as_tuple().digits), value.adjusted()
        if (digits > 15 or not -300 < exponent < 300) and Decimal(repr(number)) != value:
            raise InexactNumber(value)
        return number
    raise TypeError(f"{type(value).__name__} is not JSON")


#: The most digits an integral number is written with in full (Python's own limit is 4300).
_MOST_DIGITS = 4000


class InexactNumber(ValueError):
    """A ``Decimal`` whose float would hold another value than it (more than 17 digits)."""


def json_encoder(*, sort_keys: bool = False, ensure_ascii: bool = True) -> Callable[[Any], str]:
    """``json.dumps(value, separators=(",", ":"), default=json_default, ...)``, built once.

    ``json.dumps`` given any option builds a new encoder at each call, which
    cost as much as encoding a record: a text or digest made of every record
    or value calls one encoder built here instead, with the same output.
    A value holding a number a float would round is written by
    :func:`_exact_text`: the same text, that number's digits kept (a float
    made 0.99999999999999999 1.0 in a ``json`` column).
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    strings = (
        json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    )
    plain: Callable[[Any], str]
    if make is None:  # (an interpreter without json's C accelerator)
        plain = json.JSONEncoder(
            ensure_ascii=ensure_ascii,
            sort_keys=sort_keys,
            separators=(",", ":"),
            default=json_default,
        ).encode
    else:
        # (markers, default, strings, indent, key and item separators, sort_keys, skipkeys,
        # allow_nan); no markers: a decoded document holds no cycle.
        encode = make(None, json_default, strings, None, ":", ",", sort_keys, False, True)

        def plain(value: Any) -> str:
            return "".join(encode(value, 0))

    def text(value: Any) -> str:
        try:
            return plain(value)
        except InexactNumber:
            return _exact_text(value, plain, strings, sort_keys)

    return text


def _exact_text(
    value: Any, plain: Callable[[Any], str], strings: Callable[[str], str], sort_keys: bool
) -> str:
    """``plain``'s text of ``value``, but every ``Decimal`` a float would round as its digits."""
    if isinstance(value, Mapping):
        items = sorted(value.items()) if sort_keys else value.items()
        return (
            "{"
            + ",".join(
                f"{strings(str(k))}:{_exact_text(v, plain, strings, sort_keys)}" for k, v in items
            )
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ",".join(_exact_text(v, plain, strings, sort_keys) for v in value) + "]"
    try:
        return plain(value)
    except InexactNumber:
        return str(value)  # (a Decimal's digits: 0.99999999999999999, 1.5E+30)


#: A value's compact JSON text (not ASCII-escaped), as a ``json`` column holds it.
_json_text = json_encoder(ensure_ascii=False)
#: The same, each object's keys sorted (``json_keys: sorted``).
_json_sorted_text = json_encoder(ensure_ascii=False, sort_keys=True)


def _json(plan: FieldPlan, values: list[Any]) -> pa.Array:
    text = _json_sorted_text if plan.sorted_keys else _json_text
    return _unicode_array([None if v is None else text(v) for v in values], pa.string())


_CONVERT: Mapping[str, Callable[[FieldPlan, list[Any]], pa.Array]] = {
    "int": _int,
    "float": _float,
    "decimal": _decimal,
    "bool": _bool,
    "string": _string,
    "timestamp": _timestamp,
    "timestamp_utc": _timestamp_utc,
    "naive_timestamp": _naive_timestamp,
    "date": _date,
    "json": _json,
}
