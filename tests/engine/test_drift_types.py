"""Which type changes widen a column (every former value held) and which narrow it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from combined.runtime._drift import _widens


@pytest.mark.parametrize(
    ("old", "new", "wider"),
    [
        (pa.int32(), pa.int64(), True),
        (pa.int64(), pa.int32(), False),
        # A float's identity text is its bits: every row would change (before: a widening).
        (pa.int32(), pa.float64(), False),
        (pa.int64(), pa.float64(), False),
        (pa.int32(), pa.decimal128(10, 0), True),
        (pa.int32(), pa.decimal128(12, 2), True),
        # A decimal too short for the integers' largest value narrows them
        # (before: any integer to any decimal was a widening).
        (pa.int32(), pa.decimal128(5, 0), False),
        (pa.int64(), pa.decimal128(19, 0), True),
        (pa.int64(), pa.decimal128(19, 1), False),
        (pa.int16(), pa.decimal128(5, 0), True),
        (pa.uint64(), pa.decimal128(20, 0), True),
        (pa.decimal128(10, 2), pa.decimal128(12, 4), True),
        (pa.decimal128(10, 2), pa.decimal128(10, 3), False),
        (pa.list_(pa.int32()), pa.list_(pa.int64()), True),
        (pa.list_(pa.int64()), pa.list_(pa.int32()), False),
        (pa.string(), pa.int64(), False),
    ],
)
def test_a_type_widens_only_when_it_holds_every_former_value(
    old: pa.DataType, new: pa.DataType, wider: bool
) -> None:
    assert _widens(old, new, new) is wider


def test_a_decimal_past_38_digits_is_kept_as_text_and_widens_what_it_holds() -> None:
    assert _widens(pa.decimal128(30, 2), pa.string(), pa.decimal256(50, 2))
    assert _widens(pa.int64(), pa.string(), pa.decimal256(40, 0))
    assert not _widens(pa.decimal128(30, 4), pa.string(), pa.decimal256(50, 2))
    assert not _widens(pa.int64(), pa.string(), pa.string())  # text is not a widening
