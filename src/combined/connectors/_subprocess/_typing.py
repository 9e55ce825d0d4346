"""What a program-run source's configuration says of its streams' types, over their schemas.

``types: {"<stream>.<field>": <type>}`` reads one field as another type than
its schema declares (the stream is everything before the last dot);
``naive_timestamps`` says what a date-time declared with a zone holds when
its value has no offset: ``fail`` (the default: an error naming these
options), ``utc`` (read it as UTC; a value with an offset keeps its own) or
``keep`` (the column is a timestamp without zone: values must have no offset).
``json_keys: sorted`` writes each object of a ``json`` column with its keys
sorted (the default, ``as_sent``, keeps the order the program wrote them in).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from combined.connectors._subprocess._schema import (
    NAIVE_TIMESTAMP,
    FieldPlan,
    json_keys_option,
    keys_written,
    plan_field,
)
from combined.errors import ConfigError

#: The types a field can be declared as, with the JSON Schema each one reads as.
TYPES: Mapping[str, Mapping[str, Any]] = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "date": {"type": "string", "format": "date"},
    "timestamp": {"type": "string", "format": "date-time"},
    "timestamp_without_timezone": {
        "type": "string",
        "format": "date-time",
        "airbyte_type": "timestamp_without_timezone",
    },
    "json": {},
}
NAIVE_POLICIES = ("fail", "utc", "keep")
KEYS = ("types", "naive_timestamps", "json_keys")


@dataclass(frozen=True, slots=True)
class Typing:
    """The declared field types (by stream), the naive-timestamp policy, the json keys' order."""

    types: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    naive_timestamps: str = "fail"
    json_keys: str = "as_sent"

    @classmethod
    def parse(cls, connector: str, config: Mapping[str, Any]) -> Typing:
        """The ``types``, ``naive_timestamps`` and ``json_keys`` options of ``config``;
        raises ``ConfigError``."""
        types = _by_stream(connector, config.get("types"))
        naive = config.get("naive_timestamps", "fail")
        if naive not in NAIVE_POLICIES:
            raise ConfigError(
                f"{connector} naive_timestamps must be one of {', '.join(NAIVE_POLICIES)}, "
                f"not {naive!r}",
                hint="utc reads a date-time without an offset as UTC; keep stores the "
                "column as a timestamp without zone",
                option="naive_timestamps",
            )
        return cls(types, naive, json_keys_option(connector, config.get("json_keys", "as_sent")))

    def apply(self, names: Sequence[str], plans: Sequence[FieldPlan]) -> tuple[FieldPlan, ...]:
        """The plans of the stream known by ``names``, as this configuration types them."""
        own: dict[str, str] = {}
        for name in names:
            own.update(self.types.get(name, {}))
        unknown = sorted(set(own) - {p.name for p in plans})
        if unknown:
            raise ConfigError(
                f"types: stream {names[0]!r} has no field {unknown[0]!r}",
                hint="its fields: " + ", ".join(p.name for p in plans),
                option="types",
            )
        return tuple(keys_written(self._typed(p, own.get(p.name)), self.json_keys) for p in plans)

    def _typed(self, plan: FieldPlan, declared: str | None) -> FieldPlan:
        if declared is not None:
            schema = _schema_of(declared)
            assert schema is not None, "parse() refused any other type"
            typed = plan_field(plan.name, schema)
            label = f"{declared} (by `types`, the schema says {plan.source_type})"
            # (a well-known Integer or Number declared another number: its text still read)
            numeric = typed.kind in ("int", "float", "decimal")
            return dataclasses.replace(
                typed,
                source_type=label,
                nullable=plan.nullable,
                as_text=plan.as_text if numeric else None,
            )
        if plan.kind != "timestamp" or self.naive_timestamps == "fail":
            return plan
        if self.naive_timestamps == "utc":
            label = f"{plan.source_type}, without an offset read as UTC"
            return dataclasses.replace(plan, kind="timestamp_utc", source_type=label)
        label = f"{plan.source_type}, kept without zone"
        return dataclasses.replace(
            plan, kind="naive_timestamp", arrow=NAIVE_TIMESTAMP, source_type=label
        )


def _by_stream(connector: str, value: Any) -> dict[str, dict[str, str]]:
    """``{"stream.field": type}`` grouped by stream; raises ``ConfigError``."""
    example = 'e.g. types: {"purchases.created_at": timestamp_without_timezone}'
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{connector} `types` must map stream.field to a type", hint=example, option="types"
        )
    out: dict[str, dict[str, str]] = {}
    for key, type_ in value.items():
        stream, dot, name = str(key).rpartition(".")
        if not dot or not stream or not name or _schema_of(type_) is None:
            raise ConfigError(
                f"{connector} types: {key!r}: {type_!r} must be written stream.field: type, "
                "the type one of " + ", ".join(TYPES) + " or decimal(N) (N decimals, exact)",
                hint=example,
                option="types",
            )
        out.setdefault(stream, {})[name] = str(type_)
    return out


#: ``decimal(N)``: an exact number of N decimals (``multipleOf`` 10^-N), up to 38.
_DECIMAL = re.compile(r"decimal\((\d{1,2})\)")


def _schema_of(declared: Any) -> Mapping[str, Any] | None:
    """The JSON Schema a declared type reads as; None for no such type."""
    if not isinstance(declared, str):
        return None
    if declared in TYPES:
        return TYPES[declared]
    found = _DECIMAL.fullmatch(declared)
    if found is None or int(found.group(1)) > 38:
        return None
    return {"type": "number", "multipleOf": Decimal(1).scaleb(-int(found.group(1)))}


def remedy(stream: str, plan: FieldPlan, value: Any) -> str:
    """What the configuration can declare for ``value``, which does not fit ``plan``.

    The type named must take the value itself: text reads as ``string``, a
    number as ``decimal(N)`` (exact), anything else (a boolean, an object,
    a number in a text field) only as ``json``, its JSON text. Naming
    ``string`` for a number, or ``decimal(N)`` for text, sent the user to a
    setting that fails the next capture the same way.
    """
    if isinstance(value, str):
        kind = "string"
    elif isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        kind = "decimal(N)" if plan.kind in ("int", "float", "decimal") else "json"
    else:
        kind = "json"
    text = f'or declare its type: types: {{"{stream}.{plan.name}": {kind}}} in the source'
    if plan.kind == "timestamp" and isinstance(value, str):
        text += (
            "; for date-times sent without an offset, declare naive_timestamps: utc "
            "(read them as UTC) or naive_timestamps: keep (a timestamp without zone)"
        )
    return text
