"""The JSON text Combined makes of decoded values: one encoder built once, json.dumps's output."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from combined.connectors._subprocess._schema import json_default, json_encoder
from combined.connectors.http._restart import canonical


@pytest.mark.parametrize(
    "value",
    [
        {"b": [1, 2.5, None, True], "a": {"z": "é ☃ \u2028", "y": Decimal("1.50")}},
        [Decimal("12345678901234567890"), Decimal("0.1"), float("nan"), float("-inf")],
        'naïve "quoted" \\ text\n',
        Decimal("7.000"),
        [],
    ],
)
def test_the_encoder_built_once_writes_what_json_dumps_writes(value: Any) -> None:
    assert canonical(value) == json.dumps(
        value, sort_keys=True, default=json_default, separators=(",", ":")
    )
    assert json_encoder(ensure_ascii=False)(value) == json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, default=json_default
    )


def test_a_number_a_double_would_round_keeps_its_digits_and_nothing_else_changes() -> None:
    value = {
        "z": [Decimal("0.99999999999999999"), Decimal("1.50"), "é"],
        "a": {"y": Decimal("-12345678901234567890.25"), "x": Decimal("1E-40")},
    }
    assert json_encoder(ensure_ascii=False)(value) == (
        '{"z":[0.99999999999999999,1.5,"é"],"a":{"y":-12345678901234567890.25,"x":1e-40}}'
    )
    assert canonical(value) == (
        '{"a":{"x":1e-40,"y":-12345678901234567890.25},"z":[0.99999999999999999,1.5,"\\u00e9"]}'
    )
    assert json.loads(canonical(value), parse_float=Decimal) == value


def test_an_integral_number_of_thousands_of_digits_is_written_as_the_body_wrote_it() -> None:
    """1e5000 raised (Python prints no int of more than 4300 digits), and 1e1000000 took
    minutes of CPU to print (found by a review)."""
    assert json_encoder()([Decimal("1e5000"), Decimal("1e1000000"), Decimal("1e3")]) == (
        "[1E+5000,1E+1000000,1000]"
    )


def test_a_programs_configuration_with_a_number_no_double_holds_is_taken() -> None:
    """A configuration a tap wrote back with 0.12345678901234567890 raised where it was made
    plain (the exact-number error of json_default reached json.dumps; found by a reread)."""
    from combined.connectors._subprocess._live import _plain

    assert _plain({"a": Decimal("0.12345678901234567890"), "b": [Decimal("2")]}) == {
        "a": 0.12345678901234568,
        "b": [2],
    }
