"""JSON records of an endpoint gathered into bounded Arrow batches, with stable types.

Types come from the endpoint's declared ``fields`` (mapped as the Singer
connector maps JSON Schema: ``timestamp`` is RFC 3339 with an offset,
``decimal(2)`` an exact decimal, ``json`` JSON text), else they are
inferred from the values, by JSON kind only:

| values | type |
| --- | --- |
| true/false | ``bool`` |
| whole numbers | ``int64`` |
| numbers, some with a fraction | ``double`` |
| text | ``string`` (never parsed as a date: declare ``timestamp``) |
| objects, arrays, or several kinds | ``string`` holding the JSON text |

A field's type is fixed, within a read, by the first batch holding a value
of it; a later value that does not fit fails the read naming the field and
the fix (declare its type). Across reads the inferred types are remembered
with the checkpoint (``fields`` in the state, committed with the data), so
a field keeps its type, and stays a column (null) in a read whose records
never hold it (an API leaves out null fields): a changed kind is drift for
the dataset's policy to judge. A field that never held a value is not a
column yet: its type is unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import pyarrow as pa

from combined.connectors._subprocess._rows import described
from combined.connectors._subprocess._schema import (
    BadValue,
    FieldPlan,
    integral,
    keys_written,
    plan_field,
)
from combined.connectors.http._settings import FIELD_TYPES, field_schema
from combined.errors import SchemaMismatch

#: The kinds inference gives (a subset of the declarable field types).
INFERRED = ("boolean", "integer", "number", "string", "json")


def kind_of(value: Any) -> str | None:
    """The inferred kind of one JSON value; None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, Decimal | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "json"


def infer(values: Iterable[Any]) -> str | None:
    """The kind of a field's values: one kind, number for whole and fractional, else json."""
    kinds = {k for k in map(kind_of, values) if k is not None}
    if not kinds:
        return None
    if kinds == {"integer", "number"}:
        return "number"
    return kinds.pop() if len(kinds) == 1 else "json"


def _fits(known: str, found: str) -> bool:
    return known == found or known == "json" or (known == "number" and found == "integer")


def plan(name: str, type_: str, json_keys: str = "as_sent") -> FieldPlan:
    """The column plan of a field of a declared or inferred type (``json_keys``: the source's)."""
    return keys_written(plan_field(name, field_schema(type_)), json_keys)


class Records:
    """Records of one endpoint gathered field by field, typed as described above.

    ``declared`` are the endpoint's ``fields``; ``known`` the kinds an earlier
    read inferred (from the checkpoint); ``selected`` restricts the columns;
    ``json_keys`` is the source's option (how JSON text writes an object's keys).
    """

    def __init__(
        self,
        endpoint: str,
        declared: Iterable[tuple[str, str]],
        known: Mapping[str, str],
        selected: Iterable[str] | None,
        fix: str,
        json_keys: str = "as_sent",
    ) -> None:
        self.endpoint = endpoint
        self._fix = fix
        self._json_keys = json_keys
        self._keep = None if selected is None else set(selected)
        self.declared = {n: t for n, t in declared if self._wanted(n)}
        self.known = {n: t for n, t in known.items() if t in INFERRED and n not in self.declared}
        self.plans: dict[str, FieldPlan] = {
            n: plan(n, t, json_keys) for n, t in self.declared.items()
        }
        #: The inferred kind of each field with a plan (what the next checkpoint remembers).
        self.kinds: dict[str, str] = {}
        self._rows: list[Mapping[str, Any]] = []
        self._where: list[int] = []
        self._started = False

    def _wanted(self, name: str) -> bool:
        return self._keep is None or name in self._keep

    def add(self, record: Mapping[str, Any], page: int) -> None:
        """Add one record read on ``page``."""
        self._rows.append(record)
        self._where.append(page)

    def __len__(self) -> int:
        return len(self._rows)

    def remembered(self) -> dict[str, str]:
        """The inferred kinds to remember: this read's, and earlier ones it did not see."""
        return {**self.known, **self.kinds}

    def _grow(self) -> None:
        """Give a plan to each field this batch first holds a value of."""
        if not self._started:
            self._started = True
            for name, kind in self.known.items():
                values = [r.get(name) for r in self._rows]
                found = infer(values)
                # A remembered kind holds while the values fit it; else inference
                # decides and the drift policy judges the change.
                chosen = kind if found is None or _fits(kind, found) else found
                self.plans[name] = plan(name, chosen, self._json_keys)
                self.kinds[name] = chosen
        names: dict[str, None] = {}
        for record in self._rows:
            for name in record:
                if name not in self.plans and self._wanted(name):
                    names[name] = None
        for name in names:
            self._refuse_unnamable(name)
            found = infer(r.get(name) for r in self._rows)
            if found is not None:
                self.plans[name] = plan(name, found, self._json_keys)
                self.kinds[name] = found

    def _refuse_unnamable(self, name: str) -> None:
        """A key no column can be named: a lone surrogate (``"\\ud800"``) is no Unicode text."""
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise SchemaMismatch(
                f"endpoint {self.endpoint!r}: a record holds a key that is not Unicode text "
                f"({ascii(name)}: a lone surrogate escape), which no column can be named",
                hint="fix the key at the source; nothing was committed for this dataset",
                endpoint=self.endpoint,
            ) from None

    def take(self) -> pa.RecordBatch:
        """The gathered records as one batch, and start afresh."""
        self._grow()
        arrays = []
        fields = []
        for name, field_plan in self.plans.items():
            values = [r.get(name) for r in self._rows]
            try:
                arrays.append(field_plan.column(values))
            except BadValue as bad:
                kind = self.declared.get(name)
                how = f"declared {kind}" if kind else f"its type inferred as {self.kinds[name]}"
                raise SchemaMismatch(
                    f"endpoint {self.endpoint!r}: field {name!r} holds "
                    f"{described(values[bad.index])} on page {self._where[bad.index]}, "
                    "which is not "
                    f"{bad.expected} ({how})",
                    hint=(
                        "fix the value at the source"
                        if bad.at_source
                        else "fix the value at the source or the field's declared type"
                        if kind
                        else f"declare the field's type: {self._fix}.fields: "
                        f"{{{name}: {_wider(self.kinds[name], values[bad.index])}}}"
                    )
                    + "; nothing was committed for this dataset",
                    endpoint=self.endpoint,
                    field=name,
                    page=self._where[bad.index],
                ) from None
            fields.append(pa.field(name, field_plan.arrow))
        batch = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
        self._rows = []
        self._where = []
        return batch


#: 10**38: an integer there has more digits than any decimal the lake holds.
_PAST_DECIMALS = Decimal(10) ** 38


def _wider(kind: str, value: Any) -> str:
    """The type to declare for a field inferred ``kind`` that ``value`` does not fit.

    An integer past 64 bits keeps its digits as ``decimal(0)``, or beside
    fractions as ``decimal(N)``; ``number`` (a double) would round it. One
    past 38 digits (``1e400``) no decimal holds: ``json`` keeps it.
    """
    whole = integral(value)
    if whole and abs(Decimal(value)) >= _PAST_DECIMALS:
        return "json"
    if kind == "integer":
        return "decimal(0)" if whole else "number"
    if kind == "number" and whole:
        return "decimal(N)"  # N decimals: every number of the field exact
    return "json"


__all__ = ["FIELD_TYPES", "INFERRED", "Records", "infer", "kind_of", "plan"]
