"""Batches are checked against the declared schema by type family."""

from __future__ import annotations

import pyarrow as pa
import pytest

from combined.errors import SchemaMismatch
from combined.runtime._schema_check import check_batch, family


@pytest.mark.parametrize(
    ("text", "fam"),
    [
        ("int64", "integer"),
        ("uint8", "integer"),
        ("double", "float"),
        ("decimal128(12, 2)", "decimal"),
        ("large_string", "string"),
        ("timestamp[us, tz=UTC]", "timestamp"),
        ("time64[us]", "time"),
        ("date32[day]", "date"),
        ("list<item: int64>", "list"),
        ("dictionary<values=string, indices=int32, ordered=0>", "string"),
        ("extension<arrow.uuid>", None),
    ],
)
def test_family_of_arrow_type_text(text: str, fam: str | None) -> None:
    assert family(text) == fam


def test_int_in_a_string_column_is_refused_naming_the_column() -> None:
    batch = pa.record_batch({"id": [1, 2], "name": [3, 4]})
    with pytest.raises(SchemaMismatch, match="column 'name' is declared string"):
        check_batch("s.t", batch, {"id": "int64", "name": "string"})


def test_widening_nulls_and_new_fields_pass() -> None:
    batch = pa.record_batch(
        {
            "amount": pa.array([1, 2], pa.int32()),  # an int where a decimal is declared
            "note": pa.array([None, None], pa.int64()),  # all null: no value misfits
            "extra": pa.array(["x", "y"]),  # not declared: drift policy decides
            "name": pa.array(["a", "b"], pa.large_string()),
        }
    )
    check_batch(
        "s.t",
        batch,
        {"amount": "decimal128(12, 2)", "note": "string", "name": "string"},
    )
