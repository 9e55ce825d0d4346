"""Slot and publication names of cdc datasets: valid, stable, and never shared."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from combined.connectors.postgres._stitch import slot_name

_VALID = re.compile(r"[a-z0-9_]{1,63}")
_LONG = "orders_" + "x" * 60


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("combined", "sales_eu.orders"), ("combined", "sales.eu_orders")),
        (("combined", "public.Orders"), ("combined", "public.orders")),
        (("combined", "public.a-b"), ("combined", "public.a_b")),
        (("combined", f"public.{_LONG}_a"), ("combined", f"public.{_LONG}_b")),
        (("a_b", "c.d"), ("a", "b_c.d")),
        (("Prod", "public.items"), ("prod", "public.items")),
    ],
)
def test_relations_that_read_alike_get_different_names(
    one: tuple[str, str], other: tuple[str, str]
) -> None:
    assert slot_name(*one) != slot_name(*other)


def test_a_name_is_readable_and_stable() -> None:
    # Slots outlive processes and releases: a name computed differently later
    # would orphan a slot (retaining WAL) and re-snapshot the dataset.
    assert slot_name("combined", "public.items") == "combined_public_items_dbd0ea7c36"
    assert slot_name("combined", "items") == slot_name("combined", "public.items")
    long = slot_name("combined", f"public.{_LONG}")
    assert len(long) == 63 and long.startswith("combined_public_orders_xxx")


@given(prefix=st.text(max_size=80), schema=st.text(min_size=1), table=st.text(min_size=1))
def test_every_name_is_a_valid_slot_name(prefix: str, schema: str, table: str) -> None:
    quoted = ".".join('"' + part.replace('"', '""') + '"' for part in (schema, table))
    name = slot_name(prefix, quoted)
    assert _VALID.fullmatch(name) and len(name.encode()) <= 63
