"""Keyset predicates and pages shared by the SQL connectors, without a server."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from decimal import Decimal, localcontext
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from combined.connectors._shared import keyset_pages, keyset_terms, lower_by
from combined.errors import ConfigError, ProtocolViolation

_VALUES = [None, 1, 2]


def _holds(term: list[tuple[int, str, Any]], row: tuple[Any, ...]) -> bool:
    for i, op, v in term:
        x = row[i]
        if op in ("is null", "is not null"):
            ok = (x is None) == (op == "is null")
        else:  # SQL: a comparison with NULL is never true
            ok = x is not None and {"=": x == v, ">": x > v, "<": x < v}[op]
        if not ok:
            return False
    return True


def _sort_key(nulls_first: bool) -> Any:
    def key(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple((0 if nulls_first else 2, 0) if x is None else (1, x) for x in row)

    return key


@pytest.mark.parametrize("nulls_first", [True, False])
@pytest.mark.parametrize("width", [1, 2, 3])
def test_keyset_terms_match_the_sort_order_with_nulls(nulls_first: bool, width: int) -> None:
    # Every pair of tuples over {NULL, 1, 2}: a row is "after" the values
    # exactly when the sort puts it later, "at or before" otherwise.
    key = _sort_key(nulls_first)
    tuples = list(itertools.product(_VALUES, repeat=width))
    for values in tuples:
        after = keyset_terms(list(values), after=True, nulls_first=nulls_first)
        upto = keyset_terms(list(values), after=False, nulls_first=nulls_first)
        for row in tuples:
            later = key(row) > key(values)
            assert any(_holds(t, row) for t in after) == later, (values, row)
            assert any(_holds(t, row) for t in upto) == (not later), (values, row)


def test_an_empty_page_at_an_edge_is_refused_rather_than_looped_on() -> None:
    def page(after: list[Any] | None, upto: list[Any] | None) -> Iterator[pa.RecordBatch]:
        return iter([pa.record_batch({"k": pa.array([], pa.int64())})])

    pages = keyset_pages(page, ["k"], 5, "d", edge=lambda after: [7])
    with pytest.raises(ProtocolViolation, match="edge row"):
        list(pages)


_STEPS = st.one_of(
    st.integers(0, 10**6),
    st.floats(0, 1e6, allow_nan=False),
    st.decimals(0, 10**6, allow_nan=False, allow_infinity=False, places=3),
)


@given(
    last=st.one_of(
        st.integers(-(2**64), 2**64),
        st.floats(-1e300, 1e300, allow_nan=False),
        st.decimals(-(10**30), 10**30, allow_nan=False, allow_infinity=False, places=6),
    ),
    step=_STEPS,
)
def test_a_numeric_lookback_never_narrows_the_window(last: Any, step: Any) -> None:
    # A bound above last - step would skip rows the lookback promises to re-read
    # (near 2**63 floating point rounded the bound above the checkpoint itself).
    lower = lower_by(last, step)
    assert type(lower) is type(last)
    with localcontext(prec=2000):  # exact for these values
        exact = Decimal(last) - Decimal(str(step))
        assert Decimal(lower) <= exact
        if isinstance(last, int):
            assert Decimal(lower) > exact - 1


def test_a_lookback_that_is_not_finite_is_refused() -> None:
    for step in (float("nan"), float("inf"), Decimal("NaN")):
        with pytest.raises(ConfigError, match="finite"):
            lower_by(10, step)
