"""Airbyte's well-known ``Integer`` and ``Number`` sent as JSON strings, as the protocol
allows (``well_known_types.yaml``: digits, a Number's fraction, or Infinity, -Infinity,
NaN), read exactly through a real source (a Python script)."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest

from combined.connectors.abc import ReadRequest
from combined.connectors.airbyte import AirbyteSource
from combined.errors import SchemaMismatch
from combined.protocol import RecordBatchMessage

KNOWN = "WellKnownTypes.json#/definitions/"
STREAM: dict[str, Any] = {
    "name": "s",
    "json_schema": {
        "type": "object",
        "properties": {
            "id": {"$ref": KNOWN + "Integer"},
            "n": {"anyOf": [{"$ref": KNOWN + "Number"}, {"type": "null"}]},
            "d": {"anyOf": [{"$ref": KNOWN + "Number", "multipleOf": 0.01}, {"type": "null"}]},
        },
    },
    "supported_sync_modes": ["full_refresh"],
    "source_defined_primary_key": [["id"]],
}


def _steps(*records: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"msg": {"type": "RECORD", "record": {"stream": "s", "data": r}}} for r in records]


def _read(scripted: Any, *records: dict[str, Any], **options: Any) -> list[dict[str, Any]]:
    source = AirbyteSource(scripted(_steps(*records), streams=[STREAM], **options))
    extraction = source.read(ReadRequest("s", "s", ("id",), "snapshot"))
    try:
        return [
            row
            for m in extraction
            if isinstance(m, RecordBatchMessage)
            for row in m.batch.to_pylist()
        ]
    finally:
        extraction.finish("abort")


def test_well_known_numbers_sent_as_text_are_read_exactly(scripted: Any) -> None:
    """They were refused: the text of an Integer was not an integer."""
    rows = _read(
        scripted,
        {"id": "9223372036854775807", "n": "0.1", "d": "12345678901234567890123456.78"},
        {"id": -7, "n": "Infinity", "d": "-0.01"},
        {"id": "0", "n": "NaN", "d": 1.5},
        {"id": "-12", "n": "-Infinity", "d": None},
        {"id": "007", "n": "-3", "d": "0"},
    )
    assert [r["id"] for r in rows] == [9223372036854775807, -7, 0, -12, 7]
    n = [r["n"] for r in rows]
    assert n[0] == 0.1 and n[1] == math.inf and math.isnan(n[2]) and n[3] == -math.inf
    assert n[4] == -3.0
    assert [r["d"] for r in rows] == [
        Decimal("12345678901234567890123456.78"),
        Decimal("-0.01"),
        Decimal("1.50"),
        None,
        Decimal("0.00"),
    ]


@pytest.mark.parametrize(
    ("record", "field", "said"),
    [
        ({"id": "abc"}, "id", "Airbyte's well-known Integer: 42, -7"),
        ({"id": "1.5"}, "id", "well-known Integer"),
        ({"id": "+4"}, "id", "well-known Integer"),
        ({"id": " 4"}, "id", "well-known Integer"),
        ({"id": "4_000"}, "id", "well-known Integer"),
        ({"id": "\u0664\u0662"}, "id", "well-known Integer"),  # (Arabic-Indic digits)
        ({"id": "Infinity"}, "id", "int64 holds no Infinity, -Infinity or NaN"),
        ({"id": "NaN"}, "id", "int64 holds no Infinity"),
        ({"id": "9223372036854775808"}, "id", "that fits int64"),
        ({"id": 1, "n": "1e5"}, "n", "well-known Number: 4.25, -7, Infinity"),
        ({"id": 1, "n": ".5"}, "n", "well-known Number"),
        ({"id": 1, "n": "inf"}, "n", "well-known Number"),
        ({"id": 1, "n": "12345678901234567890123"}, "n", "a double holds exactly"),
        ({"id": 1, "d": "Infinity"}, "d", "decimal128(38, 2) holds no Infinity"),
        ({"id": 1, "d": "0.001"}, "d", "an exact number that fits decimal128(38, 2)"),
    ],
)
def test_a_text_that_is_no_such_number_is_refused(
    scripted: Any, record: dict[str, Any], field: str, said: str
) -> None:
    with pytest.raises(SchemaMismatch) as caught:
        _read(scripted, record)
    message = caught.value.message
    assert f"field '{field}' of stream 's' holds" in message and said in message, message


def test_a_well_known_number_declared_another_number_still_reads_its_text(scripted: Any) -> None:
    """``types`` over a well-known Integer or Number keeps its text read as numbers."""
    (row,) = _read(scripted, {"id": "5", "n": "2.5"}, types={"s.id": "decimal(2)"})
    assert row["id"] == Decimal("5.00") and row["n"] == 2.5
